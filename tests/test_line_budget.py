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
# Issue 26 asks for at most 10,000. The package stands at 10,334: issue 26 item 11's memo and lazy
# imports (+250) and issue 32's multi-GPU build (+345) took it to 10,595, and simplification alone
# (no layout: dead code, duplicated logic folded, fields copied by name) brought it back to 10,334.
# The 334 left are the lead's to pay or to keep; this budget holds the package where it is.
# + 63 for build/context.py's LazyGpu and fingerprint memo (plan on a GPU machine: no worker start)
# and for patch_rmsnorm naming a declared backward target that was never built (issue 28).
# - 115 by simplification in gpu/, compile/, search/ (issue 26, helper gpu-cuts)
# - 109 (build-cuts): duplicated logic folded, dead branches and re-raises gone (build/ cli/ declare/)
# - 52 (store-cuts): lessons columns declared once, counts by set sizes, fields by name
# - 26 (store2-cuts): lesson records once, seeds by islice, reads through _rows, no re-parsing
# - 28 (runtime2-cuts): one custom-op schema and fake for forward and backward, one KDA cache
# + 2: runtime/kda.py maps use_qk_l2norm_in_kernel to the l2norm option (it was ignored)
# - 22 (outputs-cuts): report's sections by one helper, one-use lock dumps and temporaries gone
# - 2: gpu/check.compare takes one path for every size (a small output is one chunk)
# - 25 (build2-cuts): a re-export, a one-use Buffer class and helper gone, one unknown-X message
# - 5 (outputs-cuts): replace_folder's new folder by mkdir, which applies the umask itself
TOTAL_CODE_LINES = 10_334 + 63 - 115 - 109 - 52 - 4 - 20 - 26 - 28 + 2 - 22 - 2 - 25 - 5
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
    assert total <= TOTAL_CODE_LINES, (
        f"ptxbuild/ has {total} code lines (budget {TOTAL_CODE_LINES})"
    )
    big = {k: v for k, v in sizes.items() if v > MODULE_CODE_LINES and k not in SPLIT_PENDING}
    assert not big, f"modules over {MODULE_CODE_LINES} code lines: {big}; split them by job"
