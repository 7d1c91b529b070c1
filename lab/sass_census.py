#!/usr/bin/env python3
"""Count the SASS instructions of a cubin's loops by opcode, on any machine (no GPU): where a kernel's
instructions per iteration go, before and after a change.

    python3 lab/sass_census.py build/kda@h200/kda_recurrence-20475f64512f.cubin [--top 3]

Needs cuobjdump and nvdisasm on PATH (a CUDA toolkit, or the nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm wheels' bin/). A loop is a backward branch's span; for each function the loops
with the most tensor-core instructions (then the longest) are listed. Moves are split out: MOV and
IMAD.MOV are register permutations the compiler added to put operands where an instruction wants
them, i.e. work a different data layout would not need.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys

INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
PRED = re.compile(r"^@!?U?P\w+\s+")


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    out = {}
    for part in sass.split("Function : ")[1:]:
        name = part.split("\n", 1)[0].strip()
        out[name] = [(int(a, 16), PRED.sub("", t.strip())) for a, t in INSN.findall(part)]
    return out


def opcode(text: str) -> str:
    op = text.split()[0]
    return "MOVE" if op in ("MOV", "IMAD.MOV.U32", "IMAD.MOV") else op.split(".")[0]


def loops(ins: list[tuple[int, str]]) -> list[tuple[int, int]]:
    where = {a: i for i, (a, _) in enumerate(ins)}
    spans = []
    for i, (a, t) in enumerate(ins):
        if t.startswith("BRA") and (m := re.search(r"0x[0-9a-f]+", t)):
            target = int(m.group(0), 16)
            if target < a and target in where:
                spans.append((where[target], i))
    return spans


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cubin")
    ap.add_argument("--top", type=int, default=2, help="loops listed per function")
    a = ap.parse_args(argv)
    sass = subprocess.run(
        ["cuobjdump", "-sass", a.cubin], capture_output=True, text=True, check=True
    )
    for name, ins in functions(sass.stdout).items():
        ranked = []
        for s, e in loops(ins):
            ops = collections.Counter(opcode(t) for _, t in ins[s : e + 1])
            tensor = ops["HMMA"] + ops["HGMMA"] + ops["IMMA"]
            ranked.append((tensor, e - s + 1, s, ops))
        print(f"{name}: {len(ins)} instructions, {len(ranked)} loops")
        for tensor, n, s, ops in sorted(ranked, reverse=True)[: a.top]:
            common = ", ".join(f"{k} {v}" for k, v in ops.most_common(16))
            print(
                f"  loop at {s}: {n} instructions ({tensor} tensor, {ops['MOVE']} moves): {common}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
