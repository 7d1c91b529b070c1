"""A SYNTHETIC replay recording shaped like rmsnorm on h100 + h200, to test the warm-start benchmark.

    python benchmarks/synthetic_recording.py OUT.jsonl

Timings come from a model (bandwidth floor x penalties for launch shape, vector width, rows per block,
unroll, cache hints; optimum moves with N and differs a little between GPUs; 0.4% noise), with planted
failure regions (spills, resource limits, a compile error). The attempts go through the cache and
`ptxbuild.search.replay.export_recording`, like a real build's. Not evidence about real kernels.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ptxbuild.search import replay  # noqa: E402
from ptxbuild.search.strategies import enumerate_space  # noqa: E402
from ptxbuild.store.cache import Cache  # noqa: E402

SPACE = {
    "threads": [64, 128, 256, 512, 1024],
    "vec": [1, 2, 4, 8],
    "rows": [1, 2, 4],
    "unroll": [1, 2, 4],
    "hint": ["none", "nc"],
    "store_cs": [False, True],
}
SHAPES = [[32768, n] for n in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)]
GPUS = {
    "h100": ("sm_90a", 3.0, 1),
    "h200": ("sm_90a", 4.25, 2),
}  # arch, TB/s, preferred unroll (log2 + 1)
DEFAULT = {"threads": 128, "vec": 1, "rows": 1, "unroll": 1, "hint": "none", "store_cs": False}


def outcome(p: dict) -> str:
    if p["vec"] == 8 and p["unroll"] == 4:
        return "spill"
    if p["threads"] == 1024 and p["rows"] == 4:
        return "resource"
    if p["vec"] == 1 and p["hint"] == "nc":
        return "compile_error"
    return "ok"


def p50_ms(gpu: str, shape, p: dict) -> float:
    _, tbps, unroll_pref = GPUS[gpu]
    m, n = shape
    floor_ms = 2 * m * n * 2 / (tbps * 1e9)
    ideal = min(1024, max(64, n / (p["vec"] * 8 * p["unroll"])))
    pen = 0.15 * abs(math.log2(p["threads"] / ideal))
    pen += 0.08 * (3 - math.log2(p["vec"]))
    pen += 0.05 * abs(math.log2(p["rows"]) - (2 if n <= 2048 else 0))
    pen += 0.03 * abs(math.log2(p["unroll"]) + 1 - unroll_pref)
    pen += 0.02 * (p["hint"] == "none" and n >= 8192)
    pen += 0.01 * (not p["store_cs"] and gpu == "h200")
    noise = (
        int(
            hashlib.sha256(json.dumps([gpu, shape, p], sort_keys=True).encode()).hexdigest()[:8], 16
        )
        / 2**32
    )
    return (floor_ms * (1 + pen) + 0.003) * (1 + 0.008 * (noise - 0.5))


def generate(out: str | Path) -> int:
    cache = Cache(":memory:")
    for gpu, (arch, _, _) in GPUS.items():
        for shape in SHAPES:
            problem = {"op": "rmsnorm", "dtype": "bfloat16", "shape": shape, "options": {}}
            for p in enumerate_space(SPACE):
                o = outcome(p)
                cache.add_attempt(
                    run=f"synthetic-{gpu}",
                    target=f"rmsnorm@{gpu}",
                    op="rmsnorm",
                    gpu=gpu,
                    arch=arch,
                    problem=problem,
                    params=p,
                    outcome=o,
                    detail="synthetic",
                    compile_s=0.8,
                    verify_s=0.2 if o == "ok" else None,
                    measure_s=0.3 if o == "ok" else None,
                    p50_ms=p50_ms(gpu, shape, p) if o == "ok" else None,
                )
    defaults = {
        "rmsnorm": {
            json.dumps(
                {"op": "rmsnorm", "dtype": "bfloat16", "shape": s, "options": {}}, sort_keys=True
            ): DEFAULT
            for s in SHAPES
        }
    }
    n = replay.export_recording(cache, out, spaces={"rmsnorm": SPACE}, defaults=defaults)
    lines = Path(out).read_text().splitlines()
    header = json.loads(lines[0])
    header["synthetic"] = True
    Path(out).write_text("\n".join([json.dumps(header, sort_keys=True)] + lines[1:]) + "\n")
    return n


if __name__ == "__main__":
    print(f"{generate(sys.argv[1])} synthetic recorded configs -> {sys.argv[1]}")
