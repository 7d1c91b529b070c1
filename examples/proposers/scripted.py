"""A scripted proposer: replays a JSON script of candidates, round by round (deterministic; the CI
tests drive builds with it). Speaks the proposer protocol (ptxbuild/search/proposer.schema.json)
and needs only the standard library, like any proposer: ptxbuild starts it as a process.

    python examples/proposers/scripted.py SCRIPT.json [--log FEEDBACK.jsonl]

SCRIPT.json: {"rounds": [[candidate, ...], ...]}; round r of every problem replies with rounds[r]
(none past the end). In a candidate, "source_file": PATH (relative to the script) is read into
"source", and "@COLS@" / "@ROWS@" in a source or an edit become the task's problem shape.
--log appends every message ptxbuild sends (tasks and results) to FEEDBACK.jsonl."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROTOCOL = "ptxbuild.proposer/1"


def fill(text: str, shape: list) -> str:
    return text.replace("@ROWS@", str(shape[0])).replace("@COLS@", str(shape[-1]))


def candidate(c: dict, here: Path, shape: list) -> dict:
    c = dict(c)
    if "source_file" in c:
        c["source"] = (here / c.pop("source_file")).read_text()
    if "source" in c:
        c["source"] = fill(c["source"], shape)
    if "edits" in c:
        c["edits"] = [{**e, "replace": fill(e.get("replace", ""), shape)} for e in c["edits"]]
    return c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("script")
    ap.add_argument("--log")
    a = ap.parse_args(argv)
    script = Path(a.script)
    rounds = json.loads(script.read_text())["rounds"]
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if a.log:
            with open(a.log, "a") as f:
                f.write(json.dumps(msg, sort_keys=True) + "\n")
        if msg["type"] == "done":
            return 0
        if msg["type"] != "task":
            continue
        shape = msg["problem"]["shape"]
        todo = rounds[msg["round"]] if msg["round"] < len(rounds) else []
        cands = [candidate(c, script.parent, shape) for c in todo]
        sys.stdout.write(
            json.dumps({"protocol": PROTOCOL, "type": "candidates", "candidates": cands}) + "\n"
        )
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
