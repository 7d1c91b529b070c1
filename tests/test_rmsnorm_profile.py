"""lab/rmsnorm_profile.py: the parts that run without a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))

import rmsnorm_profile as prof  # noqa: E402


def test_copy_triton_ptx_takes_ptx_and_metadata_of_each_cache_entry(tmp_path):
    cache = tmp_path / "cache"
    for entry in ("A1", "B2"):
        (cache / entry).mkdir(parents=True)
        (cache / entry / "k.ptx").write_text(f"// {entry}")
        (cache / entry / "k.json").write_text('{"num_warps": 16}')
        (cache / entry / "k.cubin").write_bytes(b"\x7fELF")
    (cache / "A1" / "__grp__k.json").write_text("{}")  # Triton's group index, not a kernel
    dest = tmp_path / "out"
    assert prof.copy_triton_ptx(cache, dest) == 4
    assert sorted(p.name for p in dest.iterdir()) == [
        "A1-k.json",
        "A1-k.ptx",
        "B2-k.json",
        "B2-k.ptx",
    ]
    assert (dest / "B2-k.ptx").read_text() == "// B2"


def test_parse_params_types_values():
    assert prof.parse_params("threads=256,store_cs=True,load_hint=l2,stage=chunk") == {
        "threads": 256,
        "store_cs": True,
        "load_hint": "l2",
        "stage": "chunk",
    }
