#!/usr/bin/env python3
"""Session 29 probe: x1w, the persistent prefetching prepare x1p with the workspace's WQ and U written
in whole 32-byte sectors (lab/kda/plan-session29.md), verified and timed by probe_s28's harness
(imported; it is probe_s27's with the persistent variants).

    python3 lab/kda/probe_s29.py --compile-only   # CPU: registers / spills / smem / warps per SM (+ SASS)
    python3 lab/kda/probe_s29.py --dry-run        # CPU: the plan and the kernels, no compile
    python3 lab/kda/probe_s29.py                  # GPU (one H200, ~80 s): verify, then time

Variants (S27_WSTORE 1 on x1p's defines; same grid, same 29,504 B per warp, launch bound 7):
- x1w: Qg's words stay in registers from phase B to step 6; per ks, W and Qg of all 32 lanes go into
  the 1 KB of Kp^T that ks's ldmatrix just read, and lane L stores chunks L and 32 + L: every WQ
  store instruction writes 512 contiguous bytes (16 whole sectors) instead of half of each of 32.
  U the same way per vg, through the dead D / Kp^T buffer. Same bytes, same workspace layout.
- x1w5: x1w's binary on 5 warps (several chunk-heads per warp: the loop); verification only.
- x1wn: as x1pn, every blob into 512 slots (no workspace traffic to HBM); timing only.
- x1wz: as x1pz, blob_mask 0 (no workspace store, no staging): x1pz plus the held Qg registers.
x1w and x1w5 run on all 19 small and adversarial cases stage by stage, x1w also end to end on H96
1 x 8192 and H64 mixed6 (run 28b's set for x1p). A failure of either excludes all four from timing.
Timed on H96 1 x 8192 and H64 mixed6 only (--scenarios): base, x1p, x1pn, x1pz (run 28b's binaries,
byte-identical: the controls of this run's machine), x1w, x1wn, x1wz.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import probe_s28 as s28  # noqa: E402

s27, s26, kda, log = s28.s27, s28.s26, s28.kda, s28.log
PIPE_W = s28.PIPE_P + "#define S27_WSTORE 1\n"
for _v, _cap in (("x1w", 0), ("x1w5", 5), ("x1wn", 0), ("x1wz", 0)):
    _bytes = s28.NEW["x1p"][1]
    s28.NEW[_v] = (7, _bytes, PIPE_W, _cap)
    s27.S27[_v] = (
        1,
        7,
        {"n": s27.NOSTORE_MASK, "z": 0}.get(_v[-1]),
        PIPE_W + f"#define S27_WARP_BYTES {_bytes}\n",
    )
    s28.BINARY[_v] = "x1w"

DEFAULTS = [
    "--main", "x1w", "--verify-also", "x1w5", "--time", "x1p,x1pn,x1pz,x1w,x1wn,x1wz",
    "--reps", "20", "--budget", "105", "--stop-at", "90", "--json", str(HERE / "probe_s29.json"),
]  # fmt: skip
SCENARIOS = "H96:1x8192,H64:mixed6"


def scenarios(spec: str) -> list:
    """s26.SCENARIOS rows named by `spec` ("H96:1x8192,H64:mixed6", "all"), in that order."""
    if spec == "all":
        return list(s26.SCENARIOS)
    rows = {f"H{H}:{name}": (H, name, lens) for H, name, lens in s26.SCENARIOS}
    return [rows[k.strip()] for k in spec.split(",") if k.strip()]


def nvdisasm() -> str | None:
    """nvdisasm on PATH or in an nvidia-cuda-nvdisasm wheel's cu13/bin (optional: SASS counts)."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    for p in sys.path:
        cand = Path(p) / "nvidia" / "cu13" / "bin" / "nvdisasm"
        if cand.is_file():
            return str(cand)
    return None


def sass_counts(cubin: bytes, tool: str) -> dict:
    """Static counts of the store / shared-memory instructions in one cubin's SASS."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-c", f.name], capture_output=True, text=True).stdout
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text)
    c = Counter(ops)
    keep = ("STG.E.128", "STS.128", "LDS.128", "LDSM", "WARPSYNC", "STL", "LDL")
    return {
        "SASS": len(ops),
        **{k: sum(n for op, n in c.items() if op.startswith(k)) for k in keep},
    }


def compile_only() -> int:
    """x1p and x1w (and x1wz's binary is x1w's) on the scenario problems and the odd ones, f16 and
    bf16 operands: registers, spills, shared memory, warps per SM (must reach 7, x1p's); the loop plan
    (x1w's grid and cp.async groups are x1p's: probe_s28's check)."""
    bad = s28.check_pipe()
    tool = nvdisasm()
    probs = s27.compile_problems()
    for problem in probs:
        params = kda.default_params(problem)
        for op_dtype in ("f16", "bf16"):
            for name in ("x1p", "x1w"):
                t0 = time.perf_counter()
                b = s26._compile(s27.kernel_of({**params, "op_dtype": op_dtype}, problem, name))
                smem = s28.launch_of(problem, name).smem_bytes
                wps = s28.warps_per_sm(b.registers, smem)
                # the timed problems (L2 norm on) must not spill; the verification-only ones may
                # spill a little (x1w without the L2 norm: 56 B, 7 loop-invariant words): noted
                tight = dict(problem.options).get("l2norm", True)
                lim = 16 if tight else 64
                ok = wps >= 7 and b.spill_bytes <= lim and b.local_bytes <= lim
                bad += not ok
                tag = "BAD " if not ok else "OK  " if b.spill_bytes <= 16 else "NOTE"
                sass = f", {sass_counts(b.cubin, tool)}" if tool and problem is probs[0] else ""
                log(
                    f"{tag} {problem.shape} {dict(problem.options)} {op_dtype} {name}: "
                    f"{b.registers} regs, {b.spill_bytes} B spill, {b.local_bytes} B local, {smem} B smem/block, "
                    f"{wps} warps/SM{sass} ({time.perf_counter() - t0:.1f} s)"
                )
    log("compile-only: " + ("ALL OK" if not bad else f"{bad} BAD"))
    return 1 if bad else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--compile-only" in argv:
        return compile_only()
    spec = SCENARIOS
    if "--scenarios" in argv:  # ours, not probe_s27's: taken out before its parser sees the rest
        i = argv.index("--scenarios")
        spec = argv[i + 1]
        del argv[i : i + 2]
    s27.SCENARIOS = scenarios(spec)  # what probe_s27.main precompiles and times
    s28.DEFAULTS = DEFAULTS
    return s28.main(argv)  # probe_s28's harness and memoised references; later options win


if __name__ == "__main__":
    sys.exit(main())
