"""Which shapes a verified kernel may serve: the class of shapes its verification covered (pure, L0).

The GPU worker verifies a candidate on its problem, fewer rows, the op's adversarial shapes and larger
and odd sizes of the last axis (ptxbuild/gpu/runs.py size_classes) and returns every shape it ran
(VerifyResult.shapes). A shape is in the verified class when it has as many axes, every axis is at
most the largest verified size of that axis, and its last axis has the alignment class (odd, 2 mod 4,
4 mod 8, a multiple of 8) of some verified shape's last axis: a precision or tail bug that shows only
at larger sizes or another alignment is then one verification has seen. The runtime uses it to refuse
a shape outside the class instead of dispatching an unverified kernel there."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def alignment(n: int) -> int:
    """0 for odd n, 1 for 2 mod 4, 2 for 4 mod 8, 3 for a multiple of 8."""
    k = 0
    while k < 3 and n % (2 << k) == 0:
        k += 1
    return k


def covers(verified: Iterable[Sequence[int]], shape: Sequence[int]) -> bool:
    """Is `shape` in the class of shapes `verified` covers (see the module's docstring)?"""
    shape = tuple(int(s) for s in shape)
    same = [tuple(int(s) for s in v) for v in verified if len(v) == len(shape)]
    if not same or not shape or min(shape) < 1:
        return False
    if any(s > max(v[d] for v in same) for d, s in enumerate(shape)):
        return False
    return any(alignment(v[-1]) == alignment(shape[-1]) for v in same)
