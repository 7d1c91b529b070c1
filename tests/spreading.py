"""Helpers of the tests of builds spread over several GPUs (test_spread.py, test_cluster.py): a toy
project built for an H200 (the fake worker's GPU), one build's lock and reports with the wall-clock
times masked (what varies between any two runs of one build), the fake worker's log."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from ptxbuild.build.run import build_and_lock
from ptxbuild.gpu.fingerprint import match_gpu

from .conftest import make_ctx
from .fakes import fake_match, toy_project

FAKE_WORKER = [sys.executable, str(Path(__file__).with_name("fake_worker.py"))]
SHAPES = [[64, 1024], [7, 100], [32, 512], [16, 256]]
TARGET = "scale@h200"


def h200_project(tmp_path: Path, name: str = "p") -> Path:
    """The toy project (8 problems: 2 dtypes x 4 shapes) with one GPU, the fake worker's H200."""
    proj = toy_project(tmp_path / name)
    (proj / "kernelfile.toml").write_text(
        '[project]\nname = "toy"\n\n[gpus.h200]\n\n[ops.scale]\ndtypes = ["float32", "bfloat16"]\n'
        f"shapes = {json.dumps(SHAPES)}\nsearch = {{ budget = 6 }}\n"
    )
    return proj


def match(fp, gpu):
    if isinstance(fp, dict):  # tests/fakes.py's in-process GPU
        return fake_match(fp, gpu)
    return match_gpu(fp, gpu.name, {**gpu.as_dict(), "models": [gpu.model]})


def spread_build(proj: Path, lanes: list, **kw):
    """Build the project over `lanes` (a plain one-GPU build with lanes=None and gpu=...)."""
    ctx = make_ctx(proj, gpu=lanes[0] if lanes else kw.pop("gpu"), gpu_match=match, **kw)
    ctx.lanes = list(lanes or [])
    return ctx, build_and_lock(ctx)


_WALL_CLOCK = [
    (re.compile(r'("(?:timed_at|built_at|timed_since)": )-?[0-9.e+-]+'), r"\1<wall-clock>"),
    (re.compile(r'("entry_sha256": )"[0-9a-f]{64}"'), r'\1"<sha256 of the entry>"'),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"), "<utc time>"),
    (re.compile(r"\| \d\d-\d\d \d\d:\d\d \|"), "| <utc time> |"),  # a report row's "timed"
]


def outputs(proj: Path) -> dict[str, str]:
    """The lock, the target's reports and manifest, each with what varies between two runs of one
    build masked: wall-clock times, the run id, and the lock entry's digest that covers them."""
    out = {}
    for rel in (
        "kernelfile.lock",
        f"reports/{TARGET}/report.md",
        f"reports/{TARGET}/report.json",
        f"build/{TARGET}/manifest.json",
    ):
        text = (proj / rel).read_text()
        for pattern, repl in _WALL_CLOCK:
            text = pattern.sub(repl, text)
        out[rel] = text
    return out


def log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
