"""Matching a call to a built variant: the option sets built (modes), binding arguments to one of
them, and choosing the dispatch entry whose binary is correct for a problem."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass

import numpy as np

from ..coverage import served
from ..problem import Problem
from ..records import DispatchEntry
from .arrays import dtype_of
from .errors import LoaderError


@dataclass(frozen=True)
class _Mode:
    """One option set of the target: the options the build used and the op's input names for it."""

    options: dict
    names: tuple[str, ...]

    def label(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"({', '.join(self.names)})" + (f" {{{opts}}}" if opts else "")


def is_array(v) -> bool:
    return hasattr(v, "data_ptr") or hasattr(v, "__cuda_array_interface__") or hasattr(v, "shape")


class Dispatch:
    """The dispatch half of BuiltKernel (self.op, self.entries, self.arch, self.target)."""

    # options whose value is data of the call, not of the binary (KDA's segment lengths): an entry
    # built for other values serves a call when the op renders the very same kernel for it
    RUNTIME_OPTIONS: tuple[str, ...] = ()

    def modes(self) -> list[_Mode]:
        """The option sets built, each with the op's input names for it (from make_inputs on a
        tiny problem)."""
        if self._modes is None:
            out = []
            for e in self.entries:
                p = e.problem
                if not any(m.options == p["options"] for m in out):
                    out.append(_Mode(p["options"], tuple(self._tiny_inputs(Problem.make(**p)))))
            self._modes = out
        return self._modes

    def problem_like(self, mode: _Mode) -> Problem:
        """A built problem of `mode` (its first dispatch entry)."""
        return Problem.make(
            **next(e.problem for e in self.entries if e.problem["options"] == mode.options)
        )

    def _tiny_inputs(self, problem: Problem, tiny: bool = True) -> dict:
        """The op's inputs for `problem` with its leading dims cut to at most 3 (`tiny`)."""
        if tiny:
            problem = problem.with_shape(
                tuple(min(d, 3) for d in problem.shape[:-1]) + problem.shape[-1:]
            )
        try:
            return self.op.make_inputs(problem, 0, np)
        except ValueError:  # an option sized like the problem (lengths summing to T): drop those
            opts = {k: v for k, v in problem.opts.items() if not isinstance(v, tuple | list)}
            return self.op.make_inputs(
                Problem.make(problem.op, problem.dtype, problem.shape, opts), 0, np
            )

    # leading dims of the two tiny problems _input_specs compares: distinct pairs per axis, so an
    # input axis that grows from SPEC_A[j] to SPEC_B[j] is the problem's leading dim j
    SPEC_A, SPEC_B = (2, 3, 5, 7, 11), (3, 5, 7, 11, 13)

    def _input_specs(self, problem: Problem) -> dict[str, tuple[tuple[int | None, ...], str]]:
        """name -> (shape, dtype) the op expects for `problem`: each axis of an input is the
        problem's leading dim j where it follows it (rmsnorm's x [M, N] and rstd [M]), else the
        fixed size it has (the weight [N]); None where it follows no single dim (not checked)."""
        key = (problem.dtype, problem.shape, json.dumps(problem.opts, sort_keys=True, default=str))
        if key in self._specs:
            return self._specs[key]
        lead = len(problem.shape) - 1
        a, b = (
            self._tiny_inputs(problem.with_shape(t[:lead] + problem.shape[lead:]), tiny=False)
            for t in (self.SPEC_A, self.SPEC_B)
        )
        specs = {}
        for name, x in a.items():
            axes = []
            for sa, sb in zip(x.shape, b[name].shape):
                pair = [j for j in range(lead) if (self.SPEC_A[j], self.SPEC_B[j]) == (sa, sb)]
                axes.append(sa if sa == sb else problem.shape[pair[0]] if pair else None)
            specs[name] = (tuple(axes), dtype_of(x))
        self._specs[key] = specs
        return specs

    def bind(self, args: tuple, kwargs: dict) -> tuple[_Mode, dict]:
        """Match positional and keyword arguments to one built option set: (mode, name -> array)."""
        opt_names = set(self.op.OPTIONS)
        # a tensor is always an input, even when an option shares its name (rmsnorm's `weight`)
        given_opts = {k: v for k, v in kwargs.items() if k in opt_names and not is_array(v)}
        arrays = {k: v for k, v in kwargs.items() if k not in given_opts}
        defaults = dict(self.op.OPTIONS)
        for mode in self.modes():
            full = {**defaults, **mode.options}
            if len(args) > len(mode.names) or any(full.get(k) != v for k, v in given_opts.items()):
                continue
            bound = dict(zip(mode.names, args))
            if set(bound) & set(arrays) or set(bound) | set(arrays) != set(mode.names):
                continue
            return mode, {n: (bound | arrays)[n] for n in mode.names}
        got = (
            [f"{len(args)} positional"]
            + sorted(arrays)
            + [f"{k}={v}" for k, v in sorted(given_opts.items())]
        )
        raise LoaderError(
            f"{self.target}: arguments ({', '.join(got)}) match no built mode; built: "
            + "; ".join(m.label() for m in self.modes())
        )

    def _fixed_options(self, options: dict) -> dict:
        full = json.loads(json.dumps({**dict(self.op.OPTIONS), **options}, default=list))
        return {k: v for k, v in full.items() if k not in self.RUNTIME_OPTIONS}

    def select(self, problem: Problem) -> DispatchEntry | None:
        """The dispatch entry whose binary is correct for `problem`, or None: an entry of another
        shape (or other runtime options) qualifies only if the op accepts its config for this
        problem (op.check) and renders the very same kernel for it (so shape constants baked into
        the binary agree); among those the nearest built shape wins."""
        key = (problem.dtype, problem.shape, json.dumps(problem.opts, sort_keys=True, default=str))
        if key in self._choice:
            return self._choice[key]
        want = self._fixed_options(problem.opts_json)
        same = [
            e
            for e in self.entries
            if e.problem["dtype"] == problem.dtype
            and self._fixed_options(e.problem["options"]) == want
        ]
        exact = (
            e
            for e in same
            if tuple(e.problem["shape"]) == problem.shape
            and e.problem["options"] == problem.opts_json
        )
        choice = next(exact, None)
        if choice is None:

            def distance(e):
                s, opts = e.problem["shape"], e.problem["options"]
                runtime_differs = sum(
                    opts.get(k) != problem.opts_json.get(k) for k in self.RUNTIME_OPTIONS
                )
                return (
                    len(s) != len(problem.shape),
                    runtime_differs,
                    sum(abs(np.log2(max(a, 1) / max(b, 1))) for a, b in zip(s, problem.shape)),
                )

            def serves(e):
                return (
                    len(e.problem["shape"]) == len(problem.shape)
                    and self.op.check(e.params, problem) is None
                    and self.op.render(e.params, problem, self.arch)
                    == self.op.render(e.params, Problem.make(**e.problem), self.arch)
                    and self._verified_for(e, problem)
                )

            choice = next(filter(serves, sorted(same, key=distance)), None)
        self._choice[key] = choice
        return choice

    def _verified_for(self, entry: DispatchEntry, problem: Problem) -> bool:
        """Whether `entry`'s kernel was verified on the class of `problem`'s shape (coverage.served;
        outside it the caller answers as for an unbuilt shape), warned once per shape."""
        if served(self.manifest, entry, problem.shape):
            return True
        why = (
            f"{self.target}: {problem.label()} is outside the shapes the kernel built for "
            f"{entry.label} was verified on; not dispatched there: declare the shape in "
            "kernelfile.toml and rebuild"
        )
        if not self.manifest.coverage:  # an older build: only its built shapes' class is served
            why += f"; or `ptxbuild build --locked {self.target}` records what it verified"
        if why not in (warned := self.__dict__.setdefault("_warned", set())):
            warned.add(why)
            warnings.warn(why, RuntimeWarning, stacklevel=4)
        return False

    def _built_shapes(self, dtype: str, opts: dict) -> str:
        want = self._fixed_options(opts)
        labels = set()
        for e in self.entries:
            p = e.problem
            if p["dtype"] == dtype and self._fixed_options(p["options"]) == want:
                extra = [
                    f" {k}={p['options'][k]}" for k in self.RUNTIME_OPTIONS if p["options"].get(k)
                ]
                labels.add("x".join(map(str, p["shape"])) + "".join(extra))
        return ", ".join(sorted(labels)) or "none"
