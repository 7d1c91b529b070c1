"""A build spread over several GPUs (build/spread.py) without Ray: in-process fake GPUs and the
fake worker pinned per GPU (cluster/local.py). Ray's lanes: tests/test_cluster.py."""

import json
import os
import signal
import threading
import time

import pytest
from click.testing import CliRunner

from ptxbuild.cli import main
from ptxbuild.cluster.local import local_lanes
from ptxbuild.gpu.session import LaneLost

from .fakes import FakeGpu
from .spreading import FAKE_WORKER, TARGET, h200_project, log, outputs, spread_build


class Gpu(FakeGpu):
    """tests/fakes.py's GPU as the fake worker's H200, counting what it timed per problem."""

    def __init__(self):
        super().__init__("NVIDIA H200")
        self.problems = set()

    def measure(self, op_folder, params, problem, binary, incumbent=None):
        self.problems.add(problem.label())
        return super().measure(op_folder, params, problem, binary, incumbent)


def test_the_lock_and_reports_do_not_depend_on_how_many_gpus(tmp_path):
    """1, 2 and 3 GPUs: the same lock, reports and manifest byte for byte (wall-clock times
    masked), every GPU used, and no problem timed on two GPUs."""
    got = {}
    for n in (1, 2, 3):
        proj, gpus = h200_project(tmp_path, f"n{n}"), [Gpu() for _ in range(n)]
        _, done = spread_build(proj, gpus, run="spread")
        assert done.stop is None and [r.status for r in done.results] == ["built"]
        assert all(g.measured > 0 for g in gpus), [g.measured for g in gpus]
        seen = [p for g in gpus for p in g.problems]
        assert len(seen) == len(set(seen)) == 8  # each problem timed on one GPU only
        got[n] = outputs(proj)
    assert got[1] == got[2] == got[3]
    lock = json.loads(got[2]["kernelfile.lock"].replace("<wall-clock>", "0").replace("<sha", "sha"))
    winners = [d["params"] for d in lock["targets"][TARGET]["dispatch"]]
    assert winners == [{"threads": 256, "vec": 4}] * 8  # the fake GPU's fastest


def test_a_spread_build_is_seeded_by_lessons_not_by_its_other_problems(tmp_path):
    """What makes it deterministic: a plain (sequential) build seeds later problems with the run's
    earlier winners; a spread one does not, and says so in the report's lessons. Here both find the
    same winners, so the locks are equal too."""
    plain, spread = h200_project(tmp_path, "plain"), h200_project(tmp_path, "spread")
    spread_build(plain, None, gpu=Gpu(), run="r")
    spread_build(spread, [Gpu(), Gpu()], run="r")
    a, b = outputs(plain), outputs(spread)
    assert a["kernelfile.lock"] == b["kernelfile.lock"]
    assert "seed `run:" in a[f"reports/{TARGET}/report.md"]
    assert "seed `run:" not in b[f"reports/{TARGET}/report.md"]


class Lost(Gpu):
    """A GPU that is lost for good after `after` timings (its actor and a new one died)."""

    def __init__(self, after):
        super().__init__()
        self.after = after

    def measure(self, *a, **k):
        if self.measured >= self.after:
            raise LaneLost("GPU 7: lost twice (node died)")
        return super().measure(*a, **k)


def test_a_gpu_lost_for_good_hands_its_problem_to_another(tmp_path):
    clean, lossy = h200_project(tmp_path, "clean"), h200_project(tmp_path, "lossy")
    spread_build(clean, [Gpu(), Gpu()], run="r")
    notes = []
    ok, lost = Gpu(), Lost(after=5)
    ctx, done = spread_build(
        lossy, [ok, lost], run="r", report=lambda kind, **e: notes.append(e.get("message"))
    )
    assert done.stop is None and [r.status for r in done.results] == ["built"]
    assert any(
        "lost twice (node died); its problem goes on on another GPU" in (m or "") for m in notes
    )
    assert lost.measured == 5 and ok.measured > 0
    assert outputs(lossy) == outputs(clean)  # the problem went on: no attempt made twice


def test_every_gpu_lost_stops_the_build_and_keeps_what_finished(tmp_path):
    proj = h200_project(tmp_path)
    _, done = spread_build(proj, [Lost(after=12), Lost(after=12)], run="r")
    assert "all 2 GPU(s) of this build are gone" in str(done.stop)
    assert done.results == [] and done.lock is None  # the target did not finish: not locked


class Stopper(Gpu):
    """Sends this process SIGINT (Ctrl-C) at its `at`-th timing, then blocks until aborted."""

    def __init__(self, at=None):
        super().__init__()
        self.at, self.aborted = at, threading.Event()

    def measure(self, *a, **k):
        if self.measured + 1 == self.at:
            os.kill(os.getpid(), signal.SIGINT)
            assert self.aborted.wait(30), "the stop did not abort the GPU's call in flight"
        if self.aborted.is_set():
            time.sleep(0.05)
        return super().measure(*a, **k)

    def abort(self):
        self.aborted.set()


def test_ctrl_c_stops_every_gpu_and_a_rerun_redoes_nothing_finished(tmp_path):
    """Ctrl-C mid-build: every GPU thread ends, the call in flight is not recorded, the target is
    recorded interrupted and not locked, build/ holds the problems that finished, marked incomplete
    (as a stopped one-GPU build's); the rerun times only what was not timed, and ends with the clean
    build's lock."""
    clean, proj = h200_project(tmp_path, "clean"), h200_project(tmp_path, "stopped")
    spread_build(clean, [Gpu(), Gpu()], run="r")
    total = sum(1 for line in outputs(clean)["kernelfile.lock"].splitlines() if '"p50_ms"' in line)
    assert total >= 8
    gpus = [Stopper(at=14), Stopper()]
    ctx, done = spread_build(proj, gpus, run="r1")
    assert isinstance(done.stop, KeyboardInterrupt) and done.results == []
    assert not [t for t in threading.enumerate() if t.name.startswith("ptxbuild-gpu")]
    assert not (proj / "kernelfile.lock").exists()
    assert [p.name for p in (proj / "build").iterdir()] == [TARGET]  # nothing half written
    manifest = json.loads((proj / "build" / TARGET / "manifest.json").read_text())
    finished = len(manifest["dispatch"])
    assert 0 < finished < 8 and manifest["incomplete"] == f"{finished}/8"
    assert ctx.cache.last_build(TARGET, "toy")["status"] == "interrupted"
    timed_before = sum(g.measured for g in gpus)
    again = [Gpu(), Gpu()]
    _, done = spread_build(proj, again, run="r2")
    assert done.stop is None and [r.status for r in done.results] == ["built"]
    assert outputs(proj)["kernelfile.lock"] == outputs(clean)["kernelfile.lock"]
    first = [Gpu(), Gpu()]
    spread_build(h200_project(tmp_path, "fresh"), first, run="r3")
    # the rerun timed what the stopped run had not (the call cut short is timed again)
    assert sum(g.measured for g in again) <= sum(g.measured for g in first) - timed_before + 2


def test_local_gpus_are_worker_processes_pinned_one_per_gpu(tmp_path, monkeypatch):
    """Without Ray: one fake worker per GPU, pinned with CUDA_VISIBLE_DEVICES; the log shows both
    GPUs at work, and each problem's verify, timings and baselines on one of them."""
    monkeypatch.setenv("PTXBUILD_FAKE_LOG", str(tmp_path / "log.jsonl"))
    lanes = local_lanes(2, ids=["3", "5"], argv=FAKE_WORKER, timeout_s=120.0)
    try:
        assert [g.where for g in lanes] == ["GPU 3", "GPU 5"]
        _, done = spread_build(h200_project(tmp_path), lanes, run="r")
    finally:
        for g in lanes:
            g.close()
    assert done.stop is None and [r.status for r in done.results] == ["built"]
    calls = log(tmp_path / "log.jsonl")
    on = {}
    for c in calls:
        on.setdefault(str(c["problem"]), set()).add(c["gpu"])
    assert {g for gs in on.values() for g in gs} == {"3", "5"}
    assert len(on) == 8 and all(len(gs) == 1 for gs in on.values()), on
    assert {c["cmd"] for c in calls} == {"verify", "measure", "baselines"}


def test_local_lanes_refuse_more_gpus_than_the_machine_has():
    from ptxbuild.errors import ToolError

    with pytest.raises(
        ToolError, match=r"--gpus 3: this machine shows 2 GPU\(s\); ask for at most 2"
    ):
        local_lanes(3, ids=["0", "1"])
    with pytest.raises(ToolError, match="--gpus 1: no GPU here"):
        local_lanes(1, ids=[])


@pytest.mark.parametrize(
    "args, code, text",
    [
        (["--gpus", "2", "--no-gpu"], 2, "--no-gpu has none to spread"),
        (["--cluster", "auto", "--locked"], 2, "--locked has none to spread"),
        (["--gpus", "0"], 2, "0 is not in the range x>=1"),
    ],
)
def test_spread_flags_that_cannot_go_together_are_one_line_errors(proj, args, code, text):
    res = CliRunner().invoke(main, ["-f", str(proj / "kernelfile.toml"), "build", *args])
    assert res.exit_code == code, res.output
    assert text in res.output


def test_cluster_without_ray_says_how_to_install_it(proj, monkeypatch):
    import sys

    from ptxbuild.cli import shell

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    monkeypatch.setattr(shell, "_context", _no_gpu_context)
    res = CliRunner().invoke(
        main, ["-f", str(proj / "kernelfile.toml"), "build", "--cluster", "auto"]
    )
    assert res.exit_code == 3, res.output
    assert "--cluster needs Ray: pip install 'ptxbuild[cluster]'" in res.output


def _no_gpu_context(kf, jobs, use_gpu, progress, dry=False):
    from .conftest import make_ctx

    assert not use_gpu  # a spread build starts no single GPU worker of its own
    return make_ctx(kf.root, report=progress)


DRIVER = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from ptxbuild.cluster.local import local_lanes
from tests.spreading import FAKE_WORKER, spread_build
lanes = local_lanes(2, ids=["0", "1"], argv=FAKE_WORKER, timeout_s=120.0)
print("started", flush=True)
ctx, done = spread_build(Path({proj!r}), lanes, run="r1")
ctx.close()
sys.exit(130 if isinstance(done.stop, KeyboardInterrupt) else 0 if done.stop is None else 1)
"""


def test_ctrl_c_of_the_process_group_records_no_crash_it_caused(tmp_path):
    """A terminal's Ctrl-C reaches the GPU workers too (these fake ones die of it): the calls it
    cut short are not recorded as the candidates' crashes, and no worker is left."""
    import sqlite3
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proj, logf = h200_project(tmp_path), tmp_path / "log.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "PTXBUILD_FAKE_LOG": str(logf),
        "PTXBUILD_FAKE_DELAY_S": "0.2",
    }
    code = DRIVER.format(root=str(root), proj=str(proj))
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert p.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 60
        while len(log(logf)) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGINT)  # the driver and its workers, as a terminal's Ctrl-C
        assert p.wait(timeout=60) == 130
    finally:
        if p.poll() is None:
            p.kill()
    db = sqlite3.connect(proj / "cache/ptxbuild.sqlite")
    outcomes = {o for (o,) in db.execute("select outcome from verdicts")}
    outcomes |= {o for (o,) in db.execute("select outcome from attempts")}
    assert outcomes <= {"ok"}, outcomes
    time.sleep(1)
    for pid in {c["pid"] for c in log(logf)}:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
