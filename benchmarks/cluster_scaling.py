"""Time one build on 1 GPU and on N GPUs of this machine (issue 32); write reports/cluster/.

Each build runs in its own copy of the kernelfile's project (the kernelfile at its repository path,
ops/, cache/lessons.jsonl), from an empty cache that imports the shared lessons as any new cache
does, so that both do the same work: `ptxbuild build TARGET --gpus 1`, then `--gpus N` (or
`--cluster auto`). Both are spread builds (each problem seeded by the lessons alone), so they search
alike and must pick the same winners, up to the playoff's ties. Writes
reports/cluster/<target>-<N>gpus/: scaling.json and scaling.md (wall times, speed-up, winners and
p50s problem by problem), and each build's own report as ptxbuild rendered it (1gpu/, <N>gpus/).

    python benchmarks/cluster_scaling.py rmsnorm@h200 --gpus 2
    python benchmarks/cluster_scaling.py rmsnorm@h200 --gpus 2 -f benchmarks/rmsnorm_bf16.toml

A pass: exit 0, the same winners (or ties within 2%), speed-up >= 1.7 x on 2 GPUs (0.85 x N).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIE = 0.02  # the playoff's window: configs within 2% are ties at the protocol's resolution


def project_copy(kernelfile: Path, dest: Path) -> Path:
    """The kernelfile at its path under `dest`, with the repository's ops/ and shared lessons."""
    rel = kernelfile.resolve().relative_to(ROOT)
    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(kernelfile, dest / rel)
    shutil.copytree(ROOT / "ops", dest / "ops", ignore=shutil.ignore_patterns("__pycache__"))
    if (ROOT / "cache/lessons.jsonl").is_file():
        (dest / "cache").mkdir(exist_ok=True)
        shutil.copy2(ROOT / "cache/lessons.jsonl", dest / "cache/lessons.jsonl")
    return dest / rel


def build(kernelfile: Path, target: str, spread: list[str], log: Path) -> float:
    """Wall seconds of `ptxbuild build TARGET <spread>` in that copy; its output goes to `log`."""
    cmd = [sys.executable, "-m", "ptxbuild.cli", "-f", str(kernelfile), "build", target, *spread]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    with log.open("w") as out:
        rc = subprocess.run(cmd, cwd=kernelfile.parent, env=env, stdout=out, stderr=out).returncode
    seconds = time.perf_counter() - t0
    if rc != 0:
        sys.exit(f"{' '.join(cmd[2:])} exited {rc}; see {log}")
    return seconds


def winners(kernelfile: Path, target: str) -> dict[str, dict]:
    lock = json.loads(kernelfile.with_suffix(".lock").read_text())
    return {d["label"]: d for d in lock["targets"][target]["dispatch"]}


def compare(one: dict, many: dict) -> list[dict]:
    rows = []
    for label, a in one.items():
        b = many[label]
        ratio = b["p50_ms"] / a["p50_ms"] if a.get("p50_ms") and b.get("p50_ms") else None
        same = a["params"] == b["params"]
        rows.append(
            {
                "label": label,
                "same_winner": same,
                "tie": not same and ratio is not None and abs(ratio - 1) <= TIE,
                "one_gpu": {"params": a["params"], "p50_ms": a.get("p50_ms")},
                "n_gpus": {"params": b["params"], "p50_ms": b.get("p50_ms")},
                "p50_ratio": ratio,
            }
        )
    return rows


def markdown(data: dict) -> str:
    s = data["summary"]
    lines = [
        f"# {data['target']}: one build on 1 GPU and on {data['gpus']} GPUs",
        "",
        f"- command: `{data['command']}`; kernelfile `{data['kernelfile']}`",
        f"- wall time: 1 GPU {data['seconds']['1']:.1f} s, {data['gpus']} GPUs "
        f"{data['seconds']['n']:.1f} s: **{s['speedup']:.2f}x** (bar {s['bar']:.2f}x)",
        f"- winners: {s['same']} the same, {s['ties']} ties within {TIE:.0%}, "
        f"{s['different']} different, of {s['problems']} problems",
        f"- p50 of the N-GPU winner / the 1-GPU one: median {s['ratio_median']:.4f}, "
        f"range {s['ratio_min']:.4f}-{s['ratio_max']:.4f}",
        f"- each build's own report: `1gpu/report.md`, `{data['gpus']}gpus/report.md`",
        f"- pass: **{'yes' if s['passed'] else 'no'}**",
        "",
        "| problem | 1-GPU winner | p50 us | N-GPU winner | p50 us | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["problems"]:
        a, b = r["one_gpu"], r["n_gpus"]

        def cfg(p):
            return " ".join(f"{k}={v}" for k, v in sorted((p or {}).items()))

        def us(v):
            return f"{v * 1000:.1f}" if v else "-"

        same = "same" if r["same_winner"] else cfg(b["params"])
        ratio = f"{r['p50_ratio']:.4f}" if r["p50_ratio"] else "-"
        lines.append(
            f"| {r['label']} | {cfg(a['params'])} | {us(a['p50_ms'])} | {same} | "
            f"{us(b['p50_ms'])} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("target", help="op@gpu, e.g. rmsnorm@h200")
    ap.add_argument("--gpus", type=int, required=True, help="N: the GPUs of the second build")
    ap.add_argument("-f", "--kernelfile", default=str(ROOT / "kernelfile.toml"))
    ap.add_argument("--cluster", action="store_true", help="second build with --cluster auto (Ray)")
    ap.add_argument("--out", default=str(ROOT / "reports/cluster"))
    a = ap.parse_args()
    n_spread = ["--gpus", str(a.gpus)] + (["--cluster", "auto"] if a.cluster else [])
    out = Path(a.out) / f"{a.target}-{a.gpus}gpus"
    out.mkdir(parents=True, exist_ok=True)
    seconds, got = {}, {}
    with tempfile.TemporaryDirectory(prefix="ptxbuild-scaling-") as tmp:
        for key, spread in (("1", ["--gpus", "1"]), ("n", n_spread)):
            kf = project_copy(Path(a.kernelfile), Path(tmp) / key)
            seconds[key] = build(kf, a.target, spread, out / f"build-{key}.log")
            got[key] = winners(kf, a.target)
            report = (
                kf.parent / "reports" / a.target
            )  # the copy's reports_dir, as its kernelfile says
            report = next(kf.parent.glob(f"**/reports/**/{a.target}/report.json"), report)
            dest = out / ("1gpu" if key == "1" else f"{a.gpus}gpus")
            dest.mkdir(exist_ok=True)
            for name in ("report.md", "report.json"):
                shutil.copy2(report.with_name(name), dest / name)
    rows = compare(got["1"], got["n"])
    ratios = [r["p50_ratio"] for r in rows if r["p50_ratio"]]
    bar = 1.7 if a.gpus == 2 else 0.85 * a.gpus
    summary = {
        "speedup": seconds["1"] / seconds["n"],
        "bar": bar,
        "problems": len(rows),
        "same": sum(r["same_winner"] for r in rows),
        "ties": sum(r["tie"] for r in rows),
        "different": sum(not r["same_winner"] and not r["tie"] for r in rows),
        "ratio_median": statistics.median(ratios) if ratios else float("nan"),
        "ratio_min": min(ratios, default=float("nan")),
        "ratio_max": max(ratios, default=float("nan")),
    }
    summary["passed"] = summary["speedup"] >= bar and summary["different"] == 0
    data = {
        "target": a.target,
        "gpus": a.gpus,
        "kernelfile": str(Path(a.kernelfile).resolve().relative_to(ROOT)),
        "command": "python benchmarks/cluster_scaling.py " + " ".join(sys.argv[1:]),
        "seconds": seconds,
        "summary": summary,
        "problems": rows,
    }
    (out / "scaling.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    (out / "scaling.md").write_text(markdown(data))
    print(markdown(data))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
