"""FlashKDA as a KDA baseline (issue 30) without a GPU or torch: where ops/kda/baselines.py finds a
build, what it says where there is none, the argument layout it passes to flash_kda.fwd, its own
accuracy verdict, and benchmarks/flashkda_prepare.py's source preparation (on small git repositories)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ptxbuild.dtypes import from_float
from ptxbuild.oploader import load_module, load_op
from ptxbuild.problem import Problem

ROOT = Path(__file__).resolve().parents[1]
op = load_op("kda", ROOT)
bl = sys.modules[op.__name__ + "_baselines"]
prep = load_module(ROOT / "benchmarks" / "flashkda_prepare.py", "flashkda_prepare")
P = Problem.make("kda", "bfloat16", (37, 2), {"lengths": (17, 20)})


def fake_build(root: Path, digest: str = "ab" * 32, so: bool = True) -> Path:
    """The files `flashkda_prepare.py build` leaves in its cache directory (nothing that runs)."""
    src = root / "src"
    (src / "flash_kda").mkdir(parents=True)
    (src / "flash_kda" / "__init__.py").write_text("")
    if so:
        (src / "flash_kda_C.cpython-312-x86_64-linux-gnu.so").write_bytes(b"")
    (root / "BUILT.json").write_text(json.dumps({"digest": digest, "import_dir": "src"}))
    return root


def test_no_build_is_a_named_skip_not_a_call(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHKDA_BUILD_DIR", str(tmp_path / "none"))
    fns = op.baselines(P)
    assert callable(fns["fla_chunk_kda"])
    assert isinstance(fns["flashkda"], str)
    assert fns["flashkda"].startswith(
        "FlashKDA: not built on this machine (see benchmarks/flashkda_prepare.py"
    )
    assert str(tmp_path / "none") in fns["flashkda"]


def test_a_build_is_found_by_its_files_and_names_the_baselines_version(tmp_path):
    assert bl.flashkda_built(tmp_path) is None  # nothing there
    built = bl.flashkda_built(fake_build(tmp_path / "a"))
    assert built["path"] == str(tmp_path / "a" / "src") and built["digest"] == "ab" * 32
    assert bl.flashkda_built(fake_build(tmp_path / "b", so=False)) is None  # setup.py failed midway
    (tmp_path / "a" / "BUILT.json").write_text("{truncated")
    assert bl.flashkda_built(tmp_path / "a") is None
    # a cached timing without FlashKDA is not served once it is built, nor one of another build
    v = {bl.baselines_version(None), bl.baselines_version({"digest": "ab" * 32})}
    v.add(bl.baselines_version({"digest": "cd" * 32}))
    assert len(v) == 3 and bl.baselines_version(None) == "2"


def test_the_script_and_the_baseline_look_in_the_same_place(tmp_path, monkeypatch):
    monkeypatch.delenv("FLASHKDA_BUILD_DIR", raising=False)
    assert prep.build_dir() == bl.flashkda_dir() and prep.build_dir().name == "flashkda"
    monkeypatch.setenv("FLASHKDA_BUILD_DIR", str(tmp_path))
    assert prep.build_dir() == bl.flashkda_dir() == tmp_path
    assert (prep.ENV, prep.BUILT) == (bl.FLASHKDA_ENV, "BUILT.json")


@pytest.mark.parametrize(
    "opts,why",
    [
        ({"gate": "canonical"}, "safe gate"),
        ({"l2norm": False}, "L2-normalises"),
        ({"hv": 4}, "GVA"),
        ({"K": 64, "V": 64}, "K = V = 128"),
    ],
)
def test_problems_flashkda_cannot_compute_are_skipped_with_the_reason(
    tmp_path, monkeypatch, opts, why
):
    monkeypatch.setenv("FLASHKDA_BUILD_DIR", str(fake_build(tmp_path)))
    fns = op.baselines(Problem.make("kda", "bfloat16", (37, 2), opts))
    assert isinstance(fns["flashkda"], str) and why in fns["flashkda"]


def test_a_built_flashkda_is_a_call_with_its_own_verdict(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHKDA_BUILD_DIR", str(fake_build(tmp_path)))
    fn = op.baselines(P)["flashkda"]
    assert callable(fn) and fn.compare is bl.flashkda_compare


def test_layout_matches_flash_kda_fwd_and_the_ops_inputs():
    d = op.dims(P)  # T = 37, H = 2, two segments
    lay = bl.flashkda_layout(d)
    ins = op.make_inputs(P, 1, np)
    assert lay["q"] == lay["k"] == lay["g"] == (1, 37, 2, 128) and lay["beta"] == (1, 37, 2)
    assert lay["v"] == lay["out"] == (1, 37, 2, 128)
    assert lay["initial_state"] == lay["final_state"] == (2, 2, 128, 128) and lay["cu_seqlens"] == (
        3,
    )
    # every input is a view of the op's array: same element count, same order
    for arg, name in (
        ("q", "q"),
        ("k", "k"),
        ("v", "v"),
        ("g", "a"),
        ("beta", "b"),
        ("A_log", "A_log"),
    ):
        assert np.prod(lay[arg]) == ins[name].size and lay[arg][-1] == ins[name].shape[-1], arg
    assert lay["dt_bias"] == ins["dt_bias"].shape and lay["initial_state"] == ins["h0"].shape
    assert lay["cu_seqlens"] == ins["cu_seqlens"].shape and ins["cu_seqlens"].dtype == np.int64
    one = bl.flashkda_layout(
        op.dims(Problem.make("kda", "bfloat16", (64, 2), {"initial_state": False}))
    )
    assert one["cu_seqlens"] is None and one["initial_state"] is None  # the batched path, no h0
    assert one["final_state"] == (1, 2, 128, 128)


def test_flashkda_verdict_is_looser_than_the_ops_but_rejects_a_wrong_answer():
    rng = np.random.default_rng(0)
    want = rng.standard_normal((37, 2, 128))
    noisy = want * (1 + 1e-2 * rng.standard_normal(want.shape))  # relative RMS ~1e-2
    o = from_float(noisy.astype(np.float32), "bfloat16", np)
    ok, detail = bl.flashkda_compare("o", o, want)
    e = float(detail.split()[2])
    assert ok and 8e-3 < e < 1.2e-2 and "FlashKDA's gate 0.02" in detail
    assert not op.compare(P, "o", o, want, np)[0]  # the op's own gate (5e-3) would reject it
    state = rng.standard_normal((2, 2, 128, 128)).astype(np.float32)
    assert bl.flashkda_compare("hT", state, state.astype(np.float64))[0]
    assert not bl.flashkda_compare("hT", state.swapaxes(-1, -2).copy(), state)[0]  # K-first
    bad = state.copy()
    bad[0, 0, 0, 0] = np.nan
    assert not bl.flashkda_compare("hT", bad, state)[0]


def test_make_rule_prerequisites_are_parsed_with_continuations_and_spaces():
    text = "fwd_launch.o: csrc/smxx/fwd_launch.cu csrc/fwd.h \\\n  /x/cutlass/include/a\\ b.h \\\n /usr/include/c.h\n"
    assert prep.parse_deps(text) == [
        "csrc/smxx/fwd_launch.cu",
        "csrc/fwd.h",
        "/x/cutlass/include/a b.h",
        "/usr/include/c.h",
    ]


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env |= {"GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(cwd)}
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.mark.skipif(not (shutil.which("git") and shutil.which("c++")), reason="needs git and c++")
def test_prepare_keeps_only_the_included_headers_at_the_pinned_commit(tmp_path):
    """A toy FlashKDA (a .cu including a CUTLASS header that includes another; a .cpp including torch
    and fwd.h) whose cutlass submodule pins the first of two CUTLASS commits. `nvcc -M` is played by
    the C++ preprocessor (a stand-in script that drops nvcc's own flags)."""
    cut = tmp_path / "cutlass"
    (cut / "include" / "cute").mkdir(parents=True)
    (cut / "include" / "cute" / "tensor.hpp").write_text('#include "cute/layout.hpp"\n')
    (cut / "include" / "cute" / "layout.hpp").write_text("// v1\n")
    (cut / "include" / "cute" / "unused.hpp").write_text("// never included\n")
    (cut / "include" / "cutlass").mkdir()
    (cut / "include" / "cutlass" / "bfloat16.h").write_text("// bf16\n")
    (cut / "LICENSE.txt").write_text("BSD\n")
    (cut / "media").mkdir()
    (cut / "media" / "big.png").write_bytes(b"\0" * 100)
    _git(cut, "init", "-q")
    _git(cut, "add", ".")
    _git(cut, "commit", "-qm", "v1")
    pinned = _git(cut, "rev-parse", "HEAD")
    (cut / "include" / "cute" / "layout.hpp").write_text("// v2\n")
    _git(cut, "commit", "-qam", "v2")

    fk = tmp_path / "fk"
    (fk / "csrc" / "smxx").mkdir(parents=True)
    (fk / "csrc" / "fwd.h").write_text("#include <cutlass/bfloat16.h>\n")
    (fk / "csrc" / "smxx" / "fwd_launch.cu").write_text(
        '#include "fwd.h"\n#include <cute/tensor.hpp>\n'
    )
    (fk / "csrc" / "flash_kda.cpp").write_text('#include <torch/extension.h>\n#include "fwd.h"\n')
    (fk / "flash_kda").mkdir()
    (fk / "flash_kda" / "__init__.py").write_text("")
    (fk / "setup.py").write_text("")
    (fk / "docs").mkdir()
    (fk / "docs" / "blog.md").write_text("not carried\n")
    _git(fk, "init", "-q")
    _git(fk, "add", ".")
    _git(fk, "update-index", "--add", "--cacheinfo", f"160000,{pinned},cutlass")
    _git(fk, "commit", "-qm", "release")
    release = _git(fk, "rev-parse", "HEAD")

    nvcc = tmp_path / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\n# nvcc -M played by c++: drop -gencode X and the nvcc-only flags\nargs=\n"
        'skip=0\nfor a in "$@"; do\n  if [ $skip = 1 ]; then skip=0; continue; fi\n  case $a in\n'
        "    -gencode) skip=1;;\n    -U*|--expt-*|--use_fast_math) ;;\n"
        '    *) args="$args $a";;\n  esac\ndone\nexec c++ -x c++ $args\n'
    )
    nvcc.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("")
    argv = ["prepare", str(out), "--flashkda", str(fk), "--cutlass", str(cut), "--commit", release]
    with pytest.raises(SystemExit, match="not overwriting"):
        prep.main([*argv, "--nvcc", str(nvcc)])
    (out / "mine.txt").unlink()
    prep.main([*argv, "--nvcc", str(nvcc)])

    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == [
        "FLASHKDA.json",
        "csrc/flash_kda.cpp",
        "csrc/fwd.h",
        "csrc/smxx/fwd_launch.cu",
        "cutlass/LICENSE.txt",
        "cutlass/include/cute/layout.hpp",
        "cutlass/include/cute/tensor.hpp",
        "cutlass/include/cutlass/bfloat16.h",
        "flash_kda/__init__.py",
        "setup.py",
    ]
    assert (out / "cutlass/include/cute/layout.hpp").read_text() == "// v1\n"  # the pinned commit
    assert (out / "cutlass/tools/util/include").is_dir()  # setup.py's include dirs all exist
    m = json.loads((out / "FLASHKDA.json").read_text())
    assert m["flashkda"]["commit"] == release and m["cutlass"]["commit"] == pinned
    assert m["cutlass_headers"] == 3 and set(m["files"]) == set(files) - {"FLASHKDA.json"}
    assert m["digest"] == prep.digest(out, list(m["files"]))
    prep.main([*argv, "--nvcc", str(nvcc)])  # a second run recreates the same folder
    assert json.loads((out / "FLASHKDA.json").read_text())["digest"] == m["digest"]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape,opts",
    [((37, 2), {"lengths": (17, 20)}), ((1000, 4), {}), ((1024, 4), {"initial_state": False})],
)
def test_built_flashkda_matches_the_float64_reference_within_its_gate(shape, opts):
    """The real FlashKDA (built by benchmarks/flashkda_prepare.py) on the op's inputs, through the
    baseline's conversion: within FLASHKDA_RMS_GATE of the float64 reference, o and final state."""
    cp = pytest.importorskip("cupy", reason="needs cupy and an NVIDIA GPU")
    torch = pytest.importorskip("torch", reason="FlashKDA is a torch extension")
    from ptxbuild.gpu import gpu_available
    from ptxbuild.gpu.runs import _as_cupy

    if not gpu_available():
        pytest.skip("needs an NVIDIA GPU")
    if bl.flashkda_built() is None:
        pytest.skip(bl.not_built())
    problem = Problem.make("kda", "bfloat16", shape, opts)
    ins = op.make_inputs(problem, 5, cp)
    ref = op.reference(problem, {k: v.copy() for k, v in ins.items()}, cp)
    got = op.baselines(problem)["flashkda"](ins)
    torch.cuda.synchronize()
    assert set(got) == set(ref) == {"o", "hT"}
    for name in ref:
        ok, detail = bl.flashkda_compare(name, _as_cupy(got[name], cp), ref[name])
        print(problem.label(), name, detail)
        assert ok, f"{name}: {detail}"


def test_kda_baselines_selects_which_run_and_keys_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHKDA_BUILD_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("KDA_BASELINES", " flashkda, ")
    assert set(op.baselines(P)) == {"flashkda"} and bl.selected() == {"flashkda"}
    mod = load_module(ROOT / "ops" / "kda" / "baselines.py", "kda_baselines_selected")
    assert (
        mod.BASELINES_VERSION == "2+only-flashkda"
    )  # a timing of FlashKDA alone is not served for both
    monkeypatch.setenv("KDA_BASELINES", "")
    assert set(op.baselines(P)) == {"fla_chunk_kda", "flashkda"} and bl.selected() is None
