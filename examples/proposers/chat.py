"""A chat-model proposer: each task becomes a prompt to an OpenAI-compatible chat-completions
endpoint, and the reply's first fenced code block becomes the candidate source (the incumbent's
parameters: its launch and arguments). Standard library only; ptxbuild starts it as a process and
speaks the proposer protocol with it (ptxbuild/search/proposer.schema.json).

    PTXBUILD_CHAT_URL=https://host/v1 PTXBUILD_CHAT_MODEL=name OPENAI_API_KEY=... \
        ptxbuild try softmax@h200 --proposer 'python examples/proposers/chat.py'

The URL (else OPENAI_BASE_URL), model (else OPENAI_MODEL) and key come from the environment; the
results of each round go into the next prompt, as the conversation so far."""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.error
import urllib.request

PROTOCOL = "ptxbuild.proposer/1"
FENCE = re.compile(r"```[a-zA-Z+]*\n(.*?)```", re.S)
SYSTEM = (
    "You write CUDA C++ kernels compiled by NVRTC (no headers: no <cuda_fp16.h> or <cstdint>; "
    "bfloat16 is unsigned short bits). Keep the entry name, the kernel arguments and the launch "
    "geometry of the incumbent. Reply with one fenced code block holding the whole source, then a "
    "one-line rationale."
)


def prompt(task: dict) -> str:
    inc = task.get("incumbent") or {}
    tried = "\n".join(
        f"- {a['params']}: {a['outcome']}"
        + (f", {a['p50_ms'] * 1000:.1f} us" if a.get("p50_ms") else "")
        + (f" ({(a.get('detail') or '').splitlines()[0][:200]})" if a.get("detail") else "")
        for a in task.get("attempts", [])[-12:]
    )
    lessons = "\n".join(
        f"- {ls.get('edit')}: {ls.get('verdict')} {ls.get('why', '')}"
        for ls in task.get("lessons", [])[:12]
    )
    p50 = inc.get("p50_ms")
    return (
        f"Op {task['op']} on {task['gpu']['name']} ({task['gpu']['arch']}), problem {task['problem']['label']}.\n"
        f"Reference semantics (Python):\n{task.get('reference', '')}\n"
        f"Entry: {task['template']['entry']}; template parameters {task['template']['space']}.\n"
        f"Incumbent {inc.get('params')}"
        + (f": {p50 * 1000:.1f} us, floor {task['floor_ms'] * 1000:.1f} us" if p50 else "")
        + f"\n```cuda\n{inc.get('source') or task['template']['source']}```\n"
        f"Recent attempts:\n{tried or '- none'}\nLessons:\n{lessons or '- none'}\n"
        "Write a faster correct source."
    )


def ask(messages: list) -> str:
    url = (os.environ.get("PTXBUILD_CHAT_URL") or os.environ.get("OPENAI_BASE_URL") or "").rstrip(
        "/"
    )
    model = os.environ.get("PTXBUILD_CHAT_MODEL") or os.environ.get("OPENAI_MODEL") or "gpt-4o"
    body = json.dumps({"model": model, "messages": messages, "temperature": 0}).encode()
    req = urllib.request.Request(
        url + "/chat/completions", body, {"Content-Type": "application/json"}
    )
    if key := os.environ.get("OPENAI_API_KEY"):
        req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(
        req, timeout=float(os.environ.get("PTXBUILD_CHAT_SECONDS", "240"))
    ) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"]


def main() -> int:
    history = [{"role": "system", "content": SYSTEM}]
    params = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if msg["type"] == "done":
            return 0
        if msg["type"] == "results":
            history.append(
                {"role": "user", "content": "Results: " + json.dumps(msg["results"])[:8000]}
            )
            continue
        params = (msg.get("incumbent") or {}).get("params") or msg["template"]["default_params"]
        history.append({"role": "user", "content": prompt(msg)})
        cands = []
        try:
            text = ask(history)
            history.append({"role": "assistant", "content": text})
            if m := FENCE.search(text):
                why = FENCE.sub("", text).strip().splitlines()
                params = {k: v for k, v in params.items() if k != "source"}
                cands = [
                    {
                        "params": params,
                        "source": m.group(1),
                        "edit": (why[0] if why else "chat")[:200],
                        "rationale": " ".join(why)[:2000],
                    }
                ]
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            print(f"chat proposer: {exc}", file=sys.stderr)
        sys.stdout.write(
            json.dumps({"protocol": PROTOCOL, "type": "candidates", "candidates": cands}) + "\n"
        )
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
