"""Invariants pinned before the layered move (issue 26 item 1): what a build produces must not change.

Everything is driven through the CLI (`ptxbuild build` via click's CliRunner) and read back from the
files and the SQLite cache it writes, so these tests hold whatever the modules are called. The one
seam into the code is `cli.shell._context`, patched to the fake compiler and GPU of tests/fakes.py (as
test_cli.py does); when the CLI moves, follow it in `_fake_context` below and nowhere else.

Golden files live in tests/golden/ (named *.golden, so that no tool takes them for a real lock or
manifest). After a change that is MEANT to alter what a build writes (a new
cache schema version, a new lock field), regenerate them with
    PTXBUILD_UPDATE_GOLDEN=1 python -m pytest -q tests/test_invariants.py
and say why in the commit; a refactor must leave them as they are.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ptxbuild.keys import build_key, compile_key, measure_key, verify_key
from ptxbuild.problem import Kernel, Problem

from .conftest import make_ctx
from .fakes import FakeGpu, fake_match

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("PTXBUILD_UPDATE_GOLDEN") == "1"


def _fake_context(proj, monkeypatch):
    from ptxbuild import cli

    monkeypatch.setattr(
        cli.shell,
        "_context",
        lambda kf, *a, **k: make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match),
    )
    return cli.main


@pytest.fixture
def built(proj, monkeypatch):
    """The toy project built for both GPUs: scale@h100 measured on the fake H100, scale@b200
    compile-only (no B200 present), so the cache holds compile, verify and measure rows."""
    main = _fake_context(proj, monkeypatch)
    monkeypatch.chdir(proj)
    res = CliRunner().invoke(main, ["build", "scale@h100", "scale@b200"])
    assert res.exit_code == 0, res.output
    assert "scale@h100: built (measured on hardware)" in res.output
    assert "scale@b200: built (not measured on hardware)" in res.output
    return proj


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert path.is_file(), f"{path} missing: PTXBUILD_UPDATE_GOLDEN=1 writes it"
    assert text == path.read_text(), f"{name} differs from tests/golden/{name}"


# --- keys -------------------------------------------------------------------------------------

TOOLCHAIN = {"nvrtc": "fake-1", "nvjitlink": "fake-1"}
PROBLEM = Problem("scale", "float32", (64, 1024), (("alpha", 2.0),))


def test_the_key_functions_give_todays_hex_for_fixed_inputs():
    """A key that moves invalidates every cache and lock in the field: the four key functions,
    called on fixed values, give today's digests."""
    kernel = Kernel('#define VEC 4\nextern "C" __global__ void scale() {}\n', "scale", ("-O3",))
    assert (
        compile_key(kernel, "sm_90a", TOOLCHAIN)
        == "5dd9fe985902954e46337c9911ebd5579f822874b3e7078360dcd85f4fe5be1c"
    )
    assert (
        verify_key("ab" * 32, "3", PROBLEM, {"threads": 256, "vec": 4})
        == "ec903682fdeced28b435fcb866ace81b9046c33872eaabfa24d1eae60c5eede1"
    )
    fingerprint = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "driver": "580"}
    assert (
        measure_key("ab" * 32, fingerprint, PROBLEM, {"threads": 256, "vec": 4})
        == "e50789a691c2f175c4128364a60e6cb7ecb7be9f3ddb8dc5beee61cf5cd4a96b"
    )
    assert (
        build_key(
            {"op.py": "cd" * 32, "scale.cu": "ef" * 32},
            {"dtypes": ["float32"], "shapes": [[64, 1024]]},
            {"name": "h100", "arch": "sm_90a"},
            TOOLCHAIN,
            ["01" * 32],
            fingerprint,
        )
        == "4985f56ed7ee77dbe62a623571ee2b74eec2b2582826f013c8cdd224744fec4f"
    )
    assert build_key({}, {}, {}, TOOLCHAIN, [], None) == (
        "c3091ade068076c763310b0cc7470ecb03dbabc95f31863b81b54234554bc22a"
    )


TOY_KEYS: dict[str, list[str]] = {
    "compiles": [
        "25a75d2b115a1affd405d21c485bb492c7e759e5b7eec049899f9eb394188181",
        "6d9c4db503c2476a17cb9e4174f67998f415cca0834492bfb53697982e3af8d1",
        "a95c4096dae4ce1c73f9ef2f2979673c9e2cc446bbb17241e8921114042e553b",
        "bb1478e963dca864c5f92deb1d4f7dc035f093f8e443a77a127f3d276fc78b93",
        "c683c989b23af593741addac9319db0d0bcb2aaf75eb513c164795698d86b5f7",
        "c74b0b3e3d75ec12031c06918b1854b117c8f5c424aa249af74545cf56f38af3",
        "dda06862a9cb316fb25e725fe0e0ac5724b52986ccb5305196cfe8c02c8ec616",
        "f974f46e2c80bb461b55d65c0937fa1f89f6d480b316157450bdacb1a10515f5",
    ],
    "verdicts": [
        "09d9a20ab572326b070cbfbd39ba102ac68b1d3965615a7fc9dc34e83673a56f",
        "31dc1f88bf53f7fc195be9ca886412edd81e79440651fcd132fcc1cf6b10c7f7",
        "35e874d42c85f829727304cd201ff3704c25f73438f41424643a45ba54203b7c",
        "3d1712608db4ce4bc29dbd2bbe29c20ffd7ec3e11559901e07ed4f4a6f68aa61",
        "3f5ea7021403ff60c5de340c026b1fa16e0853b401d8731b86ffa676b9009d8d",
        "43e70f407ad41331fa527b212231b956b90c682752f6b21ab78c3008fabe954a",
        "4b3006de843daba1694394c53328be9a57e58a9ac2eb4dce0b55f36218be7f89",
        "5b5e418ed79272d4be62b14ce6745e72112c3d7a1ee60fa8fffcf6e2dcf315ec",
        "640dc8ca1eae734a59e3585f0619db11e7f9e8bccc5c112be026bcf1318adba4",
        "67638fc4a03d29236ee4958aa6b535090d11127ee422a788617013654bed0fa8",
        "6db49b173fd2f08a93359a0017ca82738a1f8d9be025add057d4cf473952bbac",
        "75e34c10de8554c86da037e7759a7324e3dd8aa1f2dbd4bdc03cce04f2c3b8f9",
        "874d134a3a84886ac869261dee36b68621de7711b7dc5d633ebd20204eef5047",
        "955b9e0cfd8794fc5cd56876d05841ba19b7631e4f56fcd6665934f683c094e1",
        "a427588b662de4dac6e8b3bd0a8f23aa10441e8b68a4a418a48f33baf7a3cc3d",
        "a92b418252806c7da915ffa9bc91fa8a55da54cdaa992f5640152f05955b5148",
        "b3e5715b5bc021f445de0db5bccbb1c7b557a0beda96435148ab15f4f7a46f76",
        "c2adc8e214248c085c185490088a1979bf8c162ee7a8829e42a8face93259de0",
        "c4908b41e6054588eed0719f80a4d1239c34d1d22492d66d590a19a8430dfe06",
        "de75c42fb9b748b555dd63c0d1be9e5052812ebedf206dc2230778bca0aeb644",
        "efc3df6d23b972cea19af59254d5581c0c3870e31e87060131a1a9504af21818",
        "f01eb2d197857fed55c8511e855854f1a9db667b157167ee332dc613cf1376fb",
        "f25e8d30a9fc4d8a98957d4a6280c68f71fa7c1b6f77989ef75d2ba82258e04c",
        "fd8b2432368caa69af8ba8d9826b6eeff3a8a19ed02b072a63c75bcd3fd15a43",
    ],
    "measurements": [
        "13afa66e278e5a1a1ee97942096a8de1b02ba8a8a7f352153773ac6a15a1b061",
        "251ca011c076309aaa6a671c025cce27193f77d5920c1c544792386dad22500d",
        "397b2e815bdc9b4c6971bd5c1db2e97df691282e3103b47cea285780aad34c98",
        "3eb92cd7a801ce6f110000514316695d210a8aa78fdf3f1c2a0337b59f4a27ad",
        "4098edddb958625bd629e3429c7f0470eba7801ae68aa34d063e29ade00c5a1d",
        "41d650c2ff52dc8e4373f31843ebea4c7689660bb2f776357b479adcf3b5bd27",
        "499a2fb64984e465d6f97fdf71cbd75fdeb08b3ff53834b5800aa7d02e1d7f8f",
        "5d1bd1776d8fd1059b1d0f693da37a5d57c346b2d0aa0134307110741ba2f628",
        "60fcdac8e1797ded85f667cd748c0217d01e80d6404bfa7bc12399038f9ad6b5",
        "615edc00f0fe36ed0c8305789e66d8b3b952edb3c4663fb4977238e23da5e857",
        "64ca880cbc21f12fb5c6bec4ba93fe9ce0b2ee22324ea63df6a1f6a2afc032eb",
        "6690f067ccf98da76de40bd5d64f57ace0443a301700ae707de335065f48bd40",
        "6a812a0ae204f796bad564322c196b5021aaaea6269687f8a47737d5cca789d8",
        "6a889c1029be9656b06e409fe0ac759a163478e550d7da897cd7f3c7d03e0203",
        "7411fae2084fdd76433509864a16e3b03758470d3142392d14df6b45aa64cf08",
        "8097dabd1dcf76b1a2951a1aa77db3af2c783a4d3e5a204c290bf67b53aa7746",
        "89fb168b9136f4d3283d06261e166bb8406673f7e1c7c523d69d91d79ca0be41",
        "8c28922b5e9a5534c5401b2d480dd5b9516f51c22df239930e4d5428bbbf52f6",
        "8f4fce5414ff8f4a069740d1a8167eb7a9b8df4f7687913d4b49d0f6a5e918ab",
        "a212cfb714fc3f03b1958a1108d19a582599eb86c907373c1b3bc8db3a2225ab",
        "aa5115a927789c0b0a8dadfa1a3f8428cd46dc83d0e27288129b87185dada7cf",
        "b7fe89d35bcc4e8d4e7cb17d585c4d8ab7774d355edead9fc387f3d55c86ff6a",
        "c42a45467bde2604b24bfb388c837b491909935d02ff3e2c8b211230a8aaa0d6",
        "cecdc744a9bd02227463a228ec53c39ec7a824ad57dd235e0259033b23013b3a",
        "e0c28137aa70b03fa944c87b6f70372f670d7e1c580d9a9a74d60b49a5acac2b",
        "e23b0ada0bf0fb183b52d5dd37a213bc4ad607a8df065116617e6ddd5f93c70c",
        "e7e153d9d4fa230d9229d90008a80641cda393ad46cf9df1e158db180197932f",
        "f3ed4b8e76b0b40886ba90b8659cf259f43ac7854cb4f91f81b7f5315e996628",
    ],
    "builds": [
        "6ad8f3f4207bdcf722c444ba264a9a82ee514bd4f8a1275b142ee346932e31ae",
        "864bc9b6f3aafc5f846ed3d9d2108f89e97b9626ed95507551e8598c57449ce5",
    ],
}


def _keys(db: sqlite3.Connection, table: str, column: str = "key") -> list[str]:
    return sorted(r[0] for r in db.execute(f'SELECT "{column}" FROM "{table}"'))


def test_the_toy_builds_compile_verify_measure_and_build_keys_are_pinned(built):
    """The keys the pipeline itself derives for the toy project (op files, rendered sources, the
    fake toolchain and GPU): every row the build cached, by table."""
    db = sqlite3.connect(built / "cache/ptxbuild.sqlite")
    got = {
        "compiles": _keys(db, "compiles"),
        "verdicts": _keys(db, "verdicts"),
        "measurements": _keys(db, "measurements"),
        "builds": _keys(db, "builds"),
    }
    if UPDATE:
        print(got)
    assert got == TOY_KEYS


# --- cache schema, lock, manifests, byte for byte -----------------------------------------------


def test_the_cache_schema_is_todays(built):
    """Every CREATE statement of the cache (tables, columns, indexes, as SQLite holds them) and the
    schema version in its meta table. Nothing here is variable."""
    db = sqlite3.connect(built / "cache/ptxbuild.sqlite")
    rows = db.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY type, name"
    )
    text = "".join(f"-- {kind} {name}\n{sql};\n\n" for kind, name, sql in rows)
    meta = db.execute("SELECT key, value FROM meta ORDER BY key").fetchall()
    text += "".join(f"-- meta {k} = {v}\n" for k, v in meta)
    _golden("cache_schema.sql.golden", text)


# What legitimately varies between two runs of the same build, and nothing else:
# - "timed_at": the wall-clock time a winner or baseline was timed (time.time() in the build);
# - "wheels" in a lock entry: the installed versions of the CUDA wheels (cuda-bindings,
#   nvidia-cuda-nvrtc, nvidia-nvjitlink), which differ per machine and are null without them,
#   even though the fake compiler is used;
# - "entry_sha256": a lock entry's digest of itself, which covers the two above.
# Absolute tmp paths would be the third kind, but no file compared here holds one (asserted).
_VARIABLE = [
    (re.compile(r'("timed_at": )-?[0-9.e+-]+'), r"\1<wall-clock>"),
    (re.compile(r'("entry_sha256": )"[0-9a-f]{64}"'), r'\1"<sha256 of the entry>"'),
    (
        re.compile(r'("(?:cuda-bindings|nvidia-cuda-nvrtc|nvidia-nvjitlink)": )(?:"[^"]*"|null)'),
        r'\1"<installed wheel>"',
    ),
]


def _normalised(path: Path, proj: Path) -> str:
    text = path.read_text()
    assert str(proj) not in text and str(proj.resolve()) not in text, f"{path} holds a tmp path"
    for pattern, repl in _VARIABLE:
        text = pattern.sub(repl, text)
    return text


def test_the_lock_and_the_manifests_are_todays_byte_for_byte(built):
    lock = _normalised(built / "kernelfile.lock", built)  # 4 winners + 4 baselines timed on h100
    assert lock.count("<wall-clock>") == 8 and lock.count("<sha256 of the entry>") == 2
    _golden("toy.kernelfile.lock.golden", lock)
    for target in ("scale@h100", "scale@b200"):
        manifest = _normalised(built / "build" / target / "manifest.json", built)
        _golden(f"toy.{target}.manifest.json.golden", manifest)
    assert sorted(p.name for p in (built / "build/scale@h100").iterdir()) == [
        "manifest.json",
        "scale-00f95a08519b.cubin",
        "scale-00f95a08519b.ptx",
        "scale-aee20c7144e4.cubin",
        "scale-aee20c7144e4.ptx",
    ]


# --- public import paths (architecture.md, "Invariants") ----------------------------------------


@pytest.mark.parametrize(
    "module, names",
    [
        ("ptxbuild", ["load"]),
        ("ptxbuild.runtime", ["load", "LoaderError"]),
        ("ptxbuild.problem", ["Problem", "Kernel", "Binary", "Launch", "digest", "canonical_json"]),
        ("ptxbuild.dtypes", ["from_float", "to_float", "storage_dtype"]),
        ("ptxbuild.oploader", ["load_module"]),
        ("ptxbuild.gpu.worker", ["serve"]),
    ],
)
def test_a_public_import_path_is_kept(module, names):
    mod = importlib.import_module(module)
    for name in names:
        assert callable(getattr(mod, name, None)), f"{module}.{name} is gone"
    if module == "ptxbuild.runtime":
        assert issubclass(mod.LoaderError, Exception)


def test_the_torch_op_module_is_kept():
    assert importlib.util.find_spec("ptxbuild.torch_ops") is not None, "ptxbuild.torch_ops is gone"
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: ptxbuild.torch_ops is found, register not imported")
    assert callable(importlib.import_module("ptxbuild.torch_ops").register)


def test_python_dash_m_gpu_worker_still_starts():
    """`python -m ptxbuild.gpu.worker` is how the GPU session starts its worker: the module runs as
    a script (--help parses its arguments without touching a GPU)."""
    res = subprocess.run(
        [sys.executable, "-m", "ptxbuild.gpu.worker", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "usage:" in res.stdout
