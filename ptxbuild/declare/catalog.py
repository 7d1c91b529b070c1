"""The GPU catalog: names users write in a kernelfile and what each chip is."""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    name: str
    model: str  # what the driver reports, e.g. "NVIDIA H200"
    arch: str  # compile target, e.g. sm_90a
    family: str  # hopper, blackwell, ...
    sm_count: int
    dram_tbps: float  # datasheet memory bandwidth (measured copy bandwidth replaces it on hardware)
    smem_per_block_bytes: int
    max_cluster: int  # 1 = no thread block clusters

    def as_dict(self) -> dict:
        return dict(vars(self))  # the fields in order (asdict's deep copy: 10x slower, same dict)


CATALOG: dict[str, Gpu] = {
    g.name: g
    for g in [
        Gpu("a100", "NVIDIA A100", "sm_80", "ampere", 108, 2.04, 227 * 1024 - 1024, 1),
        Gpu("l40s", "NVIDIA L40S", "sm_89", "ada", 142, 0.864, 99 * 1024, 1),
        Gpu("h100", "NVIDIA H100", "sm_90a", "hopper", 132, 3.35, 227 * 1024, 16),
        Gpu("h200", "NVIDIA H200", "sm_90a", "hopper", 132, 4.8, 227 * 1024, 16),
        Gpu("gh200", "NVIDIA GH200", "sm_90a", "hopper", 132, 4.0, 227 * 1024, 16),
        Gpu("b200", "NVIDIA B200", "sm_100a", "blackwell", 148, 8.0, 227 * 1024, 16),
    ]
}

ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a", "sm_120")


def did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def toml_key(name: str) -> str:
    """A table name as TOML writes it: bare when it can be, else quoted."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)
