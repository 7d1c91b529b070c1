"""Fake compile and GPU stages, so the pipeline is tested without a toolchain or a GPU."""

from __future__ import annotations

import hashlib
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ptxbuild.compile.compiler import CompileError
from ptxbuild.gpu.session import MeasureResult, VerifyResult
from ptxbuild.outcome import Outcome
from ptxbuild.problem import Binary

TOY = Path(__file__).parent / "toy"


class FakeCompiler:
    """Deterministic 'binary' = hash of the source; counts calls; fails on a marker in the source."""

    def __init__(
        self,
        delay_s: float = 0.0,
        registers: int = 32,
        spill_on: str | None = None,
        error_on: str | None = None,
    ):
        self.calls: list[str] = []
        self.delay_s, self.registers, self.spill_on, self.error_on = (
            delay_s,
            registers,
            spill_on,
            error_on,
        )

    def __call__(self, kernel, arch):
        self.calls.append(kernel.source)
        time.sleep(self.delay_s)
        if self.error_on is not None and re.search(self.error_on, kernel.source):
            raise CompileError("candidate.cu(1): error: planted")
        cubin = hashlib.sha256((kernel.source + arch).encode()).digest()
        spill = 64 if self.spill_on and re.search(self.spill_on, kernel.source) else 0
        return Binary(
            arch=arch,
            entry=kernel.entry,
            ptx=f".version 9.0\n.target {arch}\n.entry {kernel.entry}(",
            cubin=cubin,
            registers=self.registers,
            spill_bytes=spill,
            smem_static_bytes=0,
            local_bytes=0,
            log="fake",
            compiler="fake",
        )


@dataclass(frozen=True)
class FakeToolchain:
    version: str = "fake-1"

    def key(self):
        return {"nvrtc": self.version, "nvjitlink": self.version}

    def __str__(self):
        return f"fake {self.version}"


def _V(outcome):
    return VerifyResult(outcome)


def _M(outcome, p50_ms, p20_ms, p80_ms):
    return MeasureResult(
        outcome, p50_ms, p20_ms, p80_ms, samples=10, floor_ms=0.001, fraction_of_floor=0.5
    )


class FakeFingerprint(dict):
    def key(self):
        return dict(self)


class FakeGpu:
    """Times are a function of the config: threads=256 and vec=4 is fastest."""

    def __init__(self, name="NVIDIA H100 80GB HBM3"):
        self.fingerprint = FakeFingerprint(name=name, sm_count=132, driver="580")
        self.copy_tbps = 3.0
        self.verified = self.measured = 0

    def verify(self, op_folder, params, problem, binary):
        self.verified += 1
        return _V(Outcome.OK)

    def measure(self, op_folder, params, problem, binary, incumbent=None):
        self.measured += 1
        t = 0.01 * (1 + abs(params["threads"] - 256) / 64 + (4 - params["vec"]))
        return _M(Outcome.OK, t, t * 0.98, t * 1.02)

    def baselines(self, op_folder, problem, winner=None, budget_ms=100.0):
        self.winners = getattr(self, "winners", []) + [winner]
        return {"eager": _M(Outcome.OK, 0.05, 0.049, 0.051)}

    def close(self):
        pass


def fake_match(fp, gpu):
    return "model" if gpu.model.split()[-1].lower() in fp["name"].lower() else None


def toy_project(tmp_path: Path) -> Path:
    dest = tmp_path / "proj"
    shutil.copytree(TOY, dest)
    return dest
