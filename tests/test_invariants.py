"""Invariants pinned before the layered move (issue 26 item 1): what a build produces must not change.

Everything is driven through the CLI (`ptxbuild build` via click's CliRunner) and read back from the
files and the SQLite cache it writes, so these tests hold whatever the modules are called. The one
seam into the code is `cli._context`, patched to the fake compiler and GPU of tests/fakes.py (as
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
        cli, "_context", lambda kf, *a, **k: make_ctx(proj, gpu=FakeGpu(), gpu_match=fake_match)
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
        == "7bb278addbaa275bb4875fe21e829beef1fa1932d3a0cee11a66f240767b47a5"
    )
    fingerprint = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "driver": "580"}
    assert (
        measure_key("ab" * 32, fingerprint, PROBLEM, {"threads": 256, "vec": 4})
        == "89d171ff970a29f0a8d03ea86a326ff1732a73cb0c76ee994736fd1a48fb42f8"
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
        "002b160154b555b76508ab22536cb0f20e72ae61139fa9a1a62730ef3931db9c",
        "0239e1c917f7bd2a5bba97775f6979804f85c37e69b53172a8e1191668c0b1ac",
        "09fa7b9bf384d8347b1c76a57428b373e02c8e2bb49063a061aa1f6c4532699f",
        "11401b61b239367feee8ac466fe523ed5e759c92b84538fdb96fe3e0b2278ad7",
        "14d8bb927bff4ea3e168964fd565b5bd0ee751fe0f9f90ceeb041abf6725a102",
        "176632dbb13caa3964e3bd4bffb5f77d98e676175b28634b035d1af2b2ac1b3b",
        "3c8a1ed852ed6f2ef5eb81d409608649fa50c752110b05faea4c216004d786a8",
        "46e3f5c7b960c5815765f3ff0cf9dfef4fd2e0e4caed276d1c51a439ec154549",
        "4dc2d029df5eb644337204848304fc2a15dd0a86be981de926b6b264cc115d3b",
        "5a02d12c03031643630682e7304f76a8c42d013fcb58505881bd90bf79cba886",
        "649c9a0ca7c6c20a5c5c2f62dade86b1807ed115dd8d2e9281e28070c75acbe5",
        "6b25743ee3c54d311744e018d581a84e0c8334c45062cb091e6d3912b17eb4c7",
        "8344b05c5ad185d42dca40097a39a1bb8469ffa5b6831f54f1b6f06be930e470",
        "858c99c1fcbf4bf9ffdc4a0308c3aaf860fc2b614debbeb9bbf5b550c5428ca7",
        "8dd093ef564c0cb28c84cb74912772f10b5b6f5c094fa01172650bb51500c9b1",
        "b1c27998f3c47dd4e6e790fd964842c8376fe0e7b2c29e19cdda7e25d8e45d4f",
        "b425758c83517295b30c84ccead1524191a209f6867155e219c6a4f502470ab2",
        "bea56020c862222522ba23962e0fb1f4c1bdd9a06a13a6d1fe26647a6f99723c",
        "d500ca7d3d82fb8cc9e5654f3c34d3b7159a87366e89ac622adbc2515540ee83",
        "da7fba821ebaee56963806cd924c104fe5da0521a37c1b86f78690198ee43924",
        "dcf6495f7b576b9a0159cc2a5d81e94452178b7b12c1dafca28b53c4b00c7e28",
        "f26b68d4406a40382ad2c83e0eb2a20f5669dabf61781981360ecdc9e252dc88",
        "f8b7146e5cdde8f629dbf30190ef07aa1065463bfd91b6b2e197dc3f459751dc",
        "fd38ba7516e792d9491070411cf65bfc9349cc386d123ef9054a5752bab5cec4",
    ],
    "measurements": [
        "0d1bb70168f2db40dc2b515440ae21f55186e75eba1e612963eca490172efc12",
        "0f70fdce158c205d7e92253de53c19d3ed63ccd4c77939472e0d4ab5e6437ac6",
        "17c1de3c9392fb9365331ead2ae3c6d4d096d156f77e94a21e1a2f272ef53aa5",
        "18d882275ee5642972e379142741ee2649296f37e6579e85ea8d04ca804d8406",
        "1de4b0e57dd2be6325d5fc5731e4122193dc460902529b830d7675a270d6ee1e",
        "250619cf00c1ba0f41fa32b23fdbd669ddc07781c4af1bb2ff51e4a2fb0c7d71",
        "268bf4e7ef1a27e37111383fcc9789a80b5d8f84f84dc9062e0f49fcbee5fd9c",
        "2729c37fc23c3eeb123bdb1211064945cf31c307b5b8d1b6b505f43460420d6c",
        "27323b4e7cbcf2528451be1d1a11b9e82478570ef4a24ab5a33751bc731dddf5",
        "350ca3162e053040e3e659c4f530768a90591106fa7e082ff534fe2a0ef45e4c",
        "399c5288410f3ec3c0430a5068bba850b4f2406b0dd2e8838bf5039387ce01f3",
        "4332c6f2395dba9f91d4834d6c09051649dde1e2c847c7058969eba81095579b",
        "69b82408db53cc2a93de78c70d5526505f0839be1b2ef68790f9e989048c2b4f",
        "77c0c52d0e40eb0c671565f0114a58bc2b15febc281f43d437744e42e03ae10f",
        "7842a147634064a64237345b50040345bf706e9028f32753cd7c924ed4782e83",
        "8c5e5f325e806055a1f5e6c9f4f8d15d3e660033b3ea28e38a234fb25074b0a3",
        "8d4c57266fda77f2e06af870ca61d416972dc4587b2c25b9b4e8dd341957e62f",
        "b37c0c6283ad1f53d7b4f0710f1d3d81153bbd0a43e2d1460d3e53e08ad08732",
        "c060f37a37d98a9c49eaa48dcec70befbd6168e98526d34b49f54e452f092aa9",
        "ca6366597e422afb98c6f4914dc5ef1007a241dd3059a01aa6aae333b8a8acb9",
        "d3555f4af2d31f98f74f6a2bd7bfbc6491273522df22afa36d7b7d73f504195f",
        "d716a376e682d294aef852c3042a0c220e6144c4fb5f18c4338b1d2954a7716c",
        "de0ffd96c291a41461ecea89cd26fd8df46375259badcb0c2a617bd58185394c",
        "e6182a1158ad1e5624784c3bf89c4f07144eb6c5470ca99cfd9b48df5d3e119c",
        "e87e773c439570fef5a4ea208d64a19318f1fb86f7f6e8dce2a72c64502fe4c8",
        "f07a252ef59dcec8d795e9b78f1888f9745d4ad34d5737c133ae7d747077cf07",
        "f68a0808fbf680932dbd3a1aaf8c960d27fde1b619c84cda8f0bb71fd70aa0b5",
        "feb4fd809ac79e746a048cc80d5a8c254319d0a41e6b29121075fd2492139025",
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
