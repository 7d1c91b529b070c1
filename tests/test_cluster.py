"""A build spread over the GPUs of a Ray cluster (cluster/ray_lanes.py), on the CPU: a local Ray
instance with two fake GPUs, one actor per GPU, each holding the fake GPU worker
(tests/fake_worker.py). `pytest -m cluster`; skipped without Ray (pip install -e '.[cluster]')."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[test,cluster]'")

from ptxbuild.cluster.ray_lanes import ray_lanes  # noqa: E402
from ptxbuild.store.cache import check  # noqa: E402

from .spreading import FAKE_WORKER, TARGET, h200_project, log, outputs, spread_build  # noqa: E402

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def address():
    """One local Ray instance for the module: 2 CPUs, 2 fake GPUs (Ray pins each actor to one)."""
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def lanes(address, tmp_path, n=2, notes=None, **env):
    return ray_lanes(
        address,
        n,
        note=(notes.append if notes is not None else lambda m: None),
        argv=FAKE_WORKER,
        timeout_s=120.0,
        env={"PTXBUILD_FAKE_LOG": str(tmp_path / "log.jsonl"), **env},
    )


def built(proj, gpus, **kw):
    ctx, done = spread_build(proj, gpus, **kw)
    try:
        assert done.stop is None and [r.status for r in done.results] == ["built"], done
    finally:
        ctx.close()
    return ctx


@pytest.fixture(scope="module")
def one_gpu(address, tmp_path_factory):
    """The reference: the same build on one GPU (one actor), and its fake worker's log."""
    tmp = tmp_path_factory.mktemp("one")
    proj = h200_project(tmp)
    built(proj, lanes(address, tmp, n=1), run="r")
    return outputs(proj), log(tmp / "log.jsonl")


def test_two_gpus_split_the_work_and_build_what_one_gpu_builds(address, one_gpu, tmp_path):
    proj = h200_project(tmp_path)
    gpus = lanes(address, tmp_path)
    assert sorted(g.where.split()[-1] for g in gpus) == ["0", "1"]  # Ray pinned one GPU each
    built(proj, gpus, run="r")
    calls = log(tmp_path / "log.jsonl")
    on = {}
    for c in calls:
        on.setdefault(str(c["problem"]), set()).add((c["gpu"], c["parent"]))
    assert len({c["parent"] for c in calls}) == 2  # two actors, each the parent of its worker
    assert {g for gs in on.values() for g, _ in gs} == {"0", "1"}
    assert len(on) == 8 and all(len(gs) == 1 for gs in on.values())  # a problem on one GPU
    ref, ref_calls = one_gpu
    assert outputs(proj) == ref  # lock, reports, manifest: byte for byte (wall-clock masked)
    assert sorted(json.dumps(c["params"]) for c in calls) == sorted(
        json.dumps(c["params"]) for c in ref_calls
    )


def test_an_actor_killed_mid_build_is_replaced_and_nothing_finished_is_redone(
    address, one_gpu, tmp_path
):
    """The fake worker kills its actor (as a lost node would) once: the call runs again on a new
    actor, the build completes with the one-GPU build's lock, the cache is sound, and the only
    call made twice is the one cut short."""
    notes, proj = [], h200_project(tmp_path)
    gpus = lanes(address, tmp_path, notes=notes, PTXBUILD_FAKE_KILL_PARENT=f"{tmp_path}/kills:1")
    built(proj, gpus, run="r")
    assert len(list(tmp_path.glob("kills.*"))) == 1 and sum(g.restarts for g in gpus) == 1
    assert any("its actor died during verify; Ray made the call again" in m for m in notes), notes
    ref, ref_calls = one_gpu
    assert outputs(proj) == ref
    verifies = [c for c in log(tmp_path / "log.jsonl") if c["cmd"] == "verify"]
    assert len(verifies) == len([c for c in ref_calls if c["cmd"] == "verify"])
    assert "integrity ok" in check(proj / "cache/ptxbuild.sqlite")


def test_a_gpu_whose_actors_keep_dying_is_reported_and_the_build_goes_on(
    address, one_gpu, tmp_path
):
    notes, proj = [], h200_project(tmp_path)
    gpus = lanes(address, tmp_path, notes=notes, PTXBUILD_FAKE_KILL_PARENT=f"{tmp_path}/kills:3")
    built(proj, gpus, run="r", report=lambda kind, **e: notes.append(e.get("message", kind)))
    assert len(list(tmp_path.glob("kills.*"))) == 3
    died = sum("its actor died" in m for m in notes)
    assert died + sum("lost (" in m and "goes on on another GPU" in m for m in notes) == 3, notes
    assert outputs(proj) == one_gpu[0]


DRIVER = """
import sys, time
sys.path.insert(0, {root!r})
import ray
ray.init(address={address!r}, log_to_driver=False)
from ptxbuild.cluster.ray_lanes import ray_lanes
from tests.spreading import FAKE_WORKER, spread_build
from pathlib import Path
env = {{"PTXBUILD_FAKE_LOG": {log!r}, "PTXBUILD_FAKE_DELAY_S": "0.2"}}
gpus = ray_lanes({address!r}, 2, argv=FAKE_WORKER, timeout_s=120.0, env=env)
print("started", flush=True)
ctx, done = spread_build(Path({proj!r}), gpus, run="r1")
ctx.close()
ray.shutdown()
sys.exit(130 if isinstance(done.stop, KeyboardInterrupt) else 0 if done.stop is None else 1)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_leaves_no_actor_no_worker_and_no_half_written_state(address, one_gpu, tmp_path):
    """SIGINT to a driver mid-build: it exits 130; its actors and their workers are gone; the
    target is not locked and build/ holds only the finished problems, marked incomplete; the rerun
    ends with the one-GPU build's lock, verifying only what the stopped run had not."""
    proj, logf = h200_project(tmp_path), tmp_path / "log.jsonl"
    code = DRIVER.format(root=str(ROOT), address=address, log=str(logf), proj=str(proj))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 120
        while len(log(logf)) < 12 and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=120) == 130
    finally:
        if p.poll() is None:
            p.kill()
    calls = log(logf)
    pids = {c["pid"] for c in calls} | {c["parent"] for c in calls}
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(pids) == 4 and not [pid for pid in pids if _alive(pid)]
    assert not (proj / "kernelfile.lock").exists()
    assert [q.name for q in (proj / "build").iterdir()] == [TARGET]
    manifest = json.loads((proj / "build" / TARGET / "manifest.json").read_text())
    assert manifest["incomplete"] == f"{len(manifest['dispatch'])}/8"
    assert "integrity ok" in check(proj / "cache/ptxbuild.sqlite")
    done_before = len([c for c in calls if c["cmd"] == "verify"])
    built(
        proj,
        lanes(address, tmp_path / "again", n=2) if (tmp_path / "again").mkdir() is None else None,
        run="r2",
    )
    assert outputs(proj)["kernelfile.lock"] == one_gpu[0]["kernelfile.lock"]
    again = [c for c in log(tmp_path / "again" / "log.jsonl") if c["cmd"] == "verify"]
    ref = [c for c in one_gpu[1] if c["cmd"] == "verify"]
    assert len(again) <= len(ref) - done_before + 2  # at most one cut-short call per GPU again


def _cli(*args, cwd=ROOT):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "ptxbuild.cli", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_doctor_lists_the_clusters_gpus_and_a_build_says_why_an_actor_did_not_start(
    address, tmp_path
):
    """`ptxbuild doctor --cluster ADDRESS` names each node with its GPUs; a build whose actors
    cannot start their (real) GPU worker, as on this CPU-only machine, is one line and exit 3."""
    res = _cli("doctor", "--cluster", address)
    assert res.returncode == 0, res.stderr
    assert "GPU(s)" in res.stdout and ": 2 GPU(s)" in res.stdout.split("cluster")[-1]
    proj = h200_project(tmp_path)
    res = _cli("-f", str(proj / "kernelfile.toml"), "build", "--cluster", address, "-q", cwd=proj)
    assert res.returncode == 3, res.stderr
    assert "a GPU actor of the cluster did not start" in res.stderr
    assert not (proj / "kernelfile.lock").exists()
