"""Winners under compute-sanitizer memcheck: an out-of-bounds read whose value is masked passes every
value check, so each winner of a GPU build runs once, on one small problem, in a one-shot worker
started under `compute-sanitizer --tool memcheck` (python -m ptxbuild.gpu.memcheck JOBFILE). An error
it reports is the outcome `memcheck`, its first report line the evidence. Parsing and the job
bookkeeping are pure (parse, pending); run() starts the processes."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VERSION = "1"  # bump when what a memcheck run does changes (cached verdicts are taken again)
ROWS = 64  # the small problem: at most this many rows, where the binary serves it
NOT_FOUND = "memcheck: not run (compute-sanitizer not found)"
MARK = "@@ptxbuild-memcheck"
ERROR_EXIT = 99
TIMEOUT_S = 180.0  # one sanitizer process (all the jobs given to it): a deadline, then "not run"


def find() -> str | None:
    """The compute-sanitizer executable: on PATH, under $CUDA_HOME / $CUDA_PATH, /usr/local/cuda."""
    if found := shutil.which("compute-sanitizer"):
        return found
    bases = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for base in bases + sorted(str(p) for p in Path("/usr/local").glob("cuda-*")):
        if base and (p := Path(base, "bin", "compute-sanitizer")).is_file():
            return str(p)
    return None


def small_problem(op, problem, params: dict, arch: str = "sm_90a"):
    """The problem on at most ROWS rows if the config accepts it and the binary serves it, else itself."""
    from ..coverage import same_binary

    if len(problem.shape) < 2 or problem.shape[0] <= ROWS:
        return problem
    small = problem.with_shape((ROWS, *problem.shape[1:]))
    try:
        ok = op.check(params, small) is None
    except Exception:  # noqa: BLE001 - a shape the op cannot judge is not one to run
        ok = False
    return small if ok and same_binary(op, params, problem, [small], arch) else problem


def command(sanitizer: str, jobfile: str, device: int = 0) -> list[str]:
    return [
        sanitizer,
        "--tool",
        "memcheck",
        "--leak-check",
        "no",
        "--report-api-errors",
        "no",  # an API call's error code (cupy probing) is not the kernel's; a bad access is
        "--error-exitcode",
        str(ERROR_EXIT),
        sys.executable,
        "-m",
        "ptxbuild.gpu.memcheck",
        "--device",
        str(device),
        jobfile,
    ]


def _report_lines(lines: list[str]) -> list[str]:
    """The sanitizer's report lines ("========= ..."), less its banner, summary and blank ones."""
    texts = (line[len("=========") :].strip() for line in lines if line.startswith("========="))
    return [t for t in texts if t and not t.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY"))]


def _not_run(why: str) -> dict:
    return {"outcome": "not_run", "detail": f"memcheck: not run ({why})"}


def parse(lines: list[str], n: int, rc: int | None) -> tuple[dict[int, dict], int | None]:
    """(results of the jobs this run settled, the index to start the next run at or None when done).
    Markers `MARK start i` / `MARK launch i` / `MARK done i` / `MARK fail i` bracket job i; the report
    lines after its launch (and before the next job's start) are its kernel's errors; lines before the
    launch (making its inputs) are the harness's: not run. A job that started and neither finished nor
    was reported on is not run (the harness failed: it says how); the jobs after a failure run again."""
    marks: dict[str, dict[int, str]] = {"start": {}, "launch": {}, "done": {}, "fail": {}}
    current, per_job = None, {}
    for line in lines:
        if line.startswith(MARK):
            kind, i, *why = line[len(MARK) :].split(maxsplit=2)
            marks.setdefault(kind, {})[int(i)] = why[0] if why else ""
            current = int(i) if kind == "start" else current
        elif current is not None and line.startswith("========="):
            per_job.setdefault(current, []).append(line)
    results = {i: {"outcome": "ok", "detail": ""} for i in marks["done"]}
    launched = marks["launch"]
    for i, job_lines in per_job.items():
        report = _report_lines(job_lines)
        if report and i not in launched:
            results[i] = _not_run(report[0][:300])
        elif report:
            where = next((r for r in report[1:] if r.startswith("Address")), "")
            results[i] = {
                "outcome": "memcheck",
                "detail": "; ".join(filter(None, [report[0], where]))[:500],
            }
    for i, why in marks["fail"].items():
        results.setdefault(i, _not_run(why[:300]))
    last = max(marks["start"], default=-1)
    if last >= 0 and last not in results:
        results[last] = _not_run(f"the sanitized worker exited {rc} during it")
    if rc == ERROR_EXIT and not per_job:
        # errors counted but no report line seen: the launched job that did not finish cleanly
        for i in sorted(launched):
            if results.get(i, {}).get("outcome") != "ok":
                results[i] = {"outcome": "memcheck", "detail": "memcheck reported an error"}
                break
    nxt = last + 1 if last + 1 < n else None
    if last < 0:  # nothing started: the worker could not start at all
        return {i: _not_run(f"worker exited {rc}") for i in range(n)}, None
    return results, nxt


def run(
    jobs: list[dict],
    device: int = 0,
    timeout_s: float = TIMEOUT_S,
    sanitizer: str | None = None,
    env: dict | None = None,
) -> list[dict]:
    """Each job ({op_folder, root, params, problem, binary}, as the worker's wire encodes them) run once
    under memcheck: [{"outcome": "ok" | "memcheck" | "not_run", "detail"}], in order. A sanitizer
    process whose context a job broke goes on in a fresh one from the next job."""
    sanitizer = sanitizer or find()
    if sanitizer is None:
        return [{"outcome": "not_run", "detail": NOT_FOUND} for _ in jobs]
    results: dict[int, dict] = {}
    start = 0
    while start is not None and start < len(jobs):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(jobs[start:], f)
        try:
            proc = subprocess.run(
                command(sanitizer, f.name, device),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                timeout=timeout_s,
            )
            lines, rc = proc.stdout.splitlines(), proc.returncode
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout or ""
            lines = (out.decode(errors="replace") if isinstance(out, bytes) else out).splitlines()
            rc = None
        finally:
            os.unlink(f.name)
        got, nxt = parse(lines, len(jobs) - start, rc)
        results.update({start + i: r for i, r in got.items()})
        if rc is None:  # timed out: the jobs it did not settle are not run
            for i in range(start, len(jobs)):
                results.setdefault(i, _not_run(f"timed out after {timeout_s:g} s"))
            break
        start = None if nxt is None else start + nxt
    return [
        results.get(i, {"outcome": "not_run", "detail": "memcheck: not run"})
        for i in range(len(jobs))
    ]


def _one(job: dict, device: int, cp, index: int = 0) -> None:
    """One call of the job's candidate on fresh poisoned outputs, synchronized (every entry it
    launches loaded once from the binary's cubin, as runs.Gpu.kernel loads it)."""
    from ..oploader import load_op
    from ..problem import op_params
    from . import check
    from . import device as device_mod
    from .worker import decode_binary, decode_problem

    op = load_op(job["op_folder"], Path(job["root"]))
    problem, binary = decode_problem(job["problem"]), decode_binary(job["binary"])
    inputs = op.make_inputs(problem, secrets.randbelow(2**31), cp)
    outputs = op.make_outputs(problem, cp)
    for out in outputs.values():
        check.poison(out, cp)
    sms = cp.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device(device).synchronize()
    print(f"{MARK} launch {index}", flush=True)
    calls = op.calls(op_params(job["params"]), problem, sms, inputs, outputs)
    entries = dict.fromkeys(e or binary["entry"] for e, _, _ in calls)
    kernels = {e: device_mod.load(e, binary["cubin"], binary.get("ptx", "")) for e in entries}
    for entry, geom, args in calls:
        device_mod.launch(kernels[entry or binary["entry"]], geom, args, stream)
    stream.synchronize()
    cp.cuda.Device(device).synchronize()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="run each job of JOBFILE once (under memcheck)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("jobfile")
    a = ap.parse_args(argv)
    import cupy as cp

    cp.cuda.Device(a.device).use()
    cp.cuda.set_allocator(None)  # every array its own allocation: a read past one is out of bounds
    jobs = json.loads(Path(a.jobfile).read_text())
    for i, job in enumerate(jobs):
        print(f"{MARK} start {i}", flush=True)
        try:
            _one(job, a.device, cp, i)
        except Exception as exc:  # noqa: BLE001 - the parent reads what happened from the markers
            msg = " ".join(f"{type(exc).__name__}: {exc}".split())
            print(f"{MARK} fail {i} {msg}", flush=True)
            return 3
        print(f"{MARK} done {i}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
