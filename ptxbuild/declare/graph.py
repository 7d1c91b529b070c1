"""Targets (op@gpu) and the dependency graph: selection, cycles, build order."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .catalog import did_you_mean


class TargetError(ConfigError):
    """A target named on the command line does not exist in the kernelfile."""


@dataclass(frozen=True, order=True)
class Target:
    op: str
    gpu: str

    def __str__(self) -> str:
        return f"{self.op}@{self.gpu}"


def find_cycle(deps: dict[str, list[str]]) -> list[str] | None:
    """A dependency cycle as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in deps.get(n, []):
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state and (c := visit(d)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(deps):
        if n not in state and (c := visit(n)):
            return c
    return None


def all_targets(kf) -> list[Target]:
    return [Target(op, g) for op, spec in kf.ops.items() for g in spec.gpus]


def parse_target(text: str, kf) -> list[Target]:
    """'op@gpu', 'op' (all its GPUs) or '@gpu' (all ops on that GPU)."""
    if text.strip() in ("", "@"):
        raise TargetError(
            f"{text!r}: an empty target; write op@gpu, op (all its GPUs) or @gpu (all ops on it)"
        )
    op, _, gpu = text.partition("@")
    if text.endswith("@"):
        raise TargetError(
            f"{text}: nothing after '@'; write op@gpu, op (all its GPUs) or @gpu (all ops on it)"
        )
    if not gpu and op in kf.gpus and op not in kf.ops:
        op, gpu = "", op
    if op and op not in kf.ops:
        raise TargetError(
            f"{text}: no op {op!r} in {kf.path.name}{did_you_mean(op, kf.ops)}; declare [ops.{op}]"
        )
    if gpu and gpu not in kf.gpus:
        raise TargetError(
            f"{text}: no GPU {gpu!r}{did_you_mean(gpu, kf.gpus)}; known: {', '.join(kf.gpus)}"
        )
    chosen = [t for t in all_targets(kf) if (not op or t.op == op) and (not gpu or t.gpu == gpu)]
    if not chosen:
        raise TargetError(f"{text}: op {op!r} does not target {gpu!r}; add it to ops.{op}.gpus")
    return chosen


def build_order(kf, requested: list[Target] | None = None) -> list[Target]:
    """Requested targets plus their dependencies (same GPU), dependencies first."""
    wanted = requested if requested is not None else all_targets(kf)
    order: list[Target] = []
    seen: set[Target] = set()

    def visit(t: Target) -> None:
        if t in seen:
            return
        seen.add(t)
        for dep in kf.ops[t.op].depends:
            if t.gpu not in kf.ops[dep].gpus:
                raise TargetError(
                    f"{t}: depends on {dep}@{t.gpu}, which ops.{dep}.gpus does not include; add {t.gpu!r}"
                )
            visit(Target(dep, t.gpu))
        order.append(t)

    for t in wanted:
        visit(t)
    return order


def dependencies(kf, t: Target) -> list[Target]:
    return [Target(d, t.gpu) for d in kf.ops[t.op].depends]
