"""build/context.py's GPU: the worker is started at its first use, and where the last worker on
these GPUs left its fingerprint in the memo, `plan` and a no-op build start none (CPU; the driver's
files, cupy and the worker are faked)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from ptxbuild.build import context
from ptxbuild.declare import memo
from ptxbuild.errors import ToolError
from ptxbuild.gpu.fingerprint import Fingerprint

H200 = Fingerprint(name="NVIDIA H200", cc="sm_90", sm_count=132, memory_bytes=150 * 2**30)


def _driver(root: Path, gpus: dict[str, str], version="NVRM version: 580.159.04") -> Path:
    (root / "gpus").mkdir(parents=True, exist_ok=True)
    (root / "version").write_text(version)
    for bus, info in gpus.items():
        (root / "gpus" / bus).mkdir(exist_ok=True)
        (root / "gpus" / bus / "information").write_text(info)
    return root


def test_host_gpus_follows_the_drivers_files_and_the_visible_devices(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert context.host_gpus(tmp_path / "absent") is None
    assert context.host_gpus(_driver(tmp_path / "none", {})) is None  # a driver, no GPU
    root = _driver(tmp_path / "one", {"0000:19:00.0": "Model: NVIDIA H200"})
    first = context.host_gpus(root)
    assert first is not None and first == context.host_gpus(root)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert context.host_gpus(root) != first
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    _driver(root, {"0000:2a:00.0": "Model: NVIDIA H200"})  # a second GPU
    second = context.host_gpus(root)
    assert second != first
    (root / "version").write_text("NVRM version: 590.1")  # another driver
    assert context.host_gpus(root) not in (first, second)


class _Worker:
    started = 0

    def __init__(self, fingerprint=H200):
        type(self).started += 1
        self.fingerprint, self.copy_tbps, self.closed = fingerprint, 4.25, False

    def measure(self, *a):
        return "timed"

    def close(self):
        self.closed = True


def test_the_worker_starts_at_its_first_use_once_and_a_plan_starts_none():
    made = []

    def start():
        made.append(_Worker())
        return made[-1]

    gpu = context.LazyGpu(H200, start)
    assert gpu.fingerprint == H200 and not made  # what plan and a fresh target read
    gpu.close()
    assert not made  # closing a worker never started starts none
    threads = [threading.Thread(target=lambda: gpu.measure()) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and gpu.measure() == "timed" and gpu.copy_tbps == 4.25
    gpu.close()
    assert made[0].closed


def test_a_worker_that_reads_another_gpu_stops_the_command():
    other = Fingerprint(name="NVIDIA H100 80GB HBM3", cc="sm_90", sm_count=132, memory_bytes=80)
    gpu = context.LazyGpu(H200, lambda: _Worker(other))
    with pytest.raises(ToolError, match="run it again"):
        gpu.measure()


def test_open_context_starts_no_worker_where_the_fingerprint_is_known(tmp_path, monkeypatch):
    monkeypatch.setenv("PTXBUILD_STATE", str(tmp_path / "state"))
    memo.book.cache_clear()
    monkeypatch.setattr(context, "host_gpus", lambda: "this-machine")
    import ptxbuild.gpu as gpu_pkg

    monkeypatch.setattr(gpu_pkg, "gpu_available", lambda: True)
    monkeypatch.setattr("ptxbuild.gpu.session.GpuSession", _Worker)
    _Worker.started = 0
    lines: list[str] = []
    h200 = SimpleNamespace(name="h200", model="h200", as_dict=lambda: {"arch": "sm_90a"})

    first = SimpleNamespace(gpu=None, gpu_match=None)
    context._attach_gpu(first, lines.append)  # nothing known: the worker starts, as before
    assert _Worker.started == 1 and isinstance(first.gpu, _Worker)
    assert lines[0].startswith("gpu: starting the worker")
    memo.book.cache_clear()  # the next command: a new process reads the memo file

    second = SimpleNamespace(gpu=None, gpu_match=None)
    context._attach_gpu(second, lines.append)
    assert isinstance(second.gpu, context.LazyGpu) and _Worker.started == 1
    assert second.gpu.fingerprint == H200 and len(lines) == 2
    assert context.hardware_for(SimpleNamespace(**vars(second), lanes=[]), h200) == H200.key()
    second.gpu.measure()  # a stale target's first measurement starts it
    assert _Worker.started == 2
    memo.book.cache_clear()
