"""A budget in code lines for the tool itself, counted as tinygrad's sz.py counts them.

Docstrings, comments and blank lines are free, so a commit that frees lines by layout alone pays
nothing; what counts is the code a reader has to follow. Run with -s to see the per-module table.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "ptxbuild"
# Issue 26 asks for at most 10,000 (ISSUE_LIMIT). The package reached 10,595 (issue 26 item 11's
# memo and lazy imports, +250; issue 32's multi-GPU build, +345) and came back under the limit by
# simplification alone, with no layout changes: dead code, duplicated logic folded into one helper,
# fields copied by name, long-hand code a stdlib call says in one. Session 27: -261, to 10,334.
# Sessions 28-29, by area: gpu/ compile/ search/ -119, build/ cli/ declare/ -134, store/ -78,
# runtime/ -48, outputs/ -27, gpu/check -2; +63 for the LazyGpu and fingerprint memo (plan on a
# GPU machine starts no worker) and the never-built backward warning (issue 28); +2 for
# runtime/kda.py's l2norm flag (session 29); -1 for COMPILER_WHEELS declared once (keys.py); +3
# for torch_ops.qualified, the backward's custom op keyed on its schema, +4 for its memo per kernel
# and mode, so a backward call does not build the schema again (session 30); +2 for
# launch.NotResident, so a cluster that cannot be resident fails its candidate, not the build (session 32);
# -2 for gpu/check's compare inlining its one-caller chunked loop (session 32); +1 for
# build/solve.py's compile-only seed order, transferred lessons before declared candidates (session 35).
# This budget holds the package where it now stands; a change that needs more says why here.
ISSUE_LIMIT = 10_000
TOTAL_CODE_LINES = 9_998
MODULE_CODE_LINES = 450
# modules still to be split by job (issue 26); each leaves this set when it is split
SPLIT_PENDING: set[str] = set()

_FREE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def _docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers covered by module, class and function docstrings."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def code_lines(source: str) -> int:
    """Lines holding at least one token that is not a comment, a docstring or layout."""
    free = _docstring_lines(ast.parse(source))
    counted: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in _FREE:
            continue
        for line in range(tok.start[0], tok.end[0] + 1):
            if line not in free:
                counted.add(line)
    return len(counted)


def test_code_lines_ignore_docstrings_comments_and_blanks():
    src = '"""Doc\nstring."""\n\n# a comment\nx = 1  # trailing\n\ndef f():\n    """Doc."""\n    return (\n        x\n    )\n'
    assert code_lines(src) == 5  # x = 1 / def f(): / return ( / x / )
    assert code_lines("") == 0


def test_the_package_stays_within_its_code_line_budget():
    sizes = {p.relative_to(PKG).as_posix(): code_lines(p.read_text()) for p in PKG.rglob("*.py")}
    table = "\n".join(f"{v:6d}  {k}" for k, v in sorted(sizes.items(), key=lambda kv: -kv[1]))
    print(f"\ncode lines per module (budget {MODULE_CODE_LINES} each, {TOTAL_CODE_LINES} in all)")
    print(f"{table}\n{sum(sizes.values()):6d}  total")
    total = sum(sizes.values())
    assert TOTAL_CODE_LINES <= ISSUE_LIMIT, "the budget may not be raised past issue 26's limit"
    assert total <= TOTAL_CODE_LINES, (
        f"ptxbuild/ has {total} code lines (budget {TOTAL_CODE_LINES})"
    )
    big = {k: v for k, v in sizes.items() if v > MODULE_CODE_LINES and k not in SPLIT_PENDING}
    assert not big, f"modules over {MODULE_CODE_LINES} code lines: {big}; split them by job"
