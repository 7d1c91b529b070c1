import pytest

from ptxbuild.build.target import Context
from ptxbuild.declare.kernelfile import load
from ptxbuild.store.cache import Cache

from .fakes import FakeCompiler, FakeToolchain, toy_project


@pytest.fixture
def proj(tmp_path):
    return toy_project(tmp_path)


def make_ctx(proj, compiler=None, **kw):
    kf = load(proj / "kernelfile.toml")
    return Context(
        kf=kf,
        cache=Cache(kf.cache_path),
        toolchain=FakeToolchain(),
        compile_fn=compiler or FakeCompiler(),
        jobs=1,
        **kw,
    )
