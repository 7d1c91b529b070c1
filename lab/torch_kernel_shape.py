"""The kernels torch.compile launches for the RMSNorm baseline, with their launch shapes.

    TORCH_LOGS=output_code python3 lab/torch_kernel_shape.py [--dtype bfloat16] [--m 32768] [--ns 256,512,1024]

For each N: builds the op's own torch.compile baseline (ops/rmsnorm/baselines.py, the one the build
times), calls it on the op's inputs, and prints each CUDA kernel of one call as torch's profiler saw
it: name, grid, block, registers per thread, shared memory. With TORCH_LOGS=output_code torch also
prints the generated Triton source (on stderr), so its block sizes and load/store hints can be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--m", type=int, default=32768)
    ap.add_argument("--ns", default="256,512,1024")
    a = ap.parse_args(argv)

    import cupy as cp
    import torch

    from ptxbuild.oploader import load_op
    from ptxbuild.problem import Problem

    op = load_op("rmsnorm", ROOT)
    for n in (int(v) for v in a.ns.split(",")):
        problem = Problem.make("rmsnorm", a.dtype, (a.m, n), {})
        fn = op.baselines(problem)["torch_compile"]
        inputs = op.make_inputs(problem, 1, cp)
        fn(inputs), fn(inputs)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn(inputs)
            torch.cuda.synchronize()
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            events = json.loads(Path(f.name).read_text())["traceEvents"]
        for e in events:
            if e.get("cat") == "kernel":
                g = e.get("args", {})
                print(
                    f"{a.dtype} {a.m}x{n}: {e['name']} grid={g.get('grid')} block={g.get('block')} "
                    f"registers={g.get('registers per thread')} smem={g.get('shared memory')} "
                    f"dur={e.get('dur')} us",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
