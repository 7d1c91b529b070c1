"""A built KDA forward target (op kda: prepare + recurrence, two kernels on one stream) called like
flash-linear-attention's `chunk_kda`, safe-gate path:

    kda = ptxbuild.load("kda@h200")
    o, final_state = kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, initial_state=h0,
                         output_final_state=True, use_qk_l2norm_in_kernel=True,
                         use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
                         lower_bound=-5.0, state_v_first=True, cu_seqlens=cu_seqlens)

Layouts are fla's: q, k [B, T, H, K], v [B, T, HV, V], g (the raw gate input) [B, T, HV, K], beta
(raw logits) [B, T, HV], all bf16; A_log [HV], dt_bias [HV * K] fp32; states fp32 [N, HV, K, V]
(or [N, HV, V, K] with state_v_first=True, the kernels' own layout: no transposed copy). Variable
length: B = 1 and int64 cu_seqlens, as in fla; its values choose the variant and the chunk layout,
so they are read on the host once per distinct call (pass cu_seqlens_cpu to avoid that device
sync, and under CUDA-graph capture). A_log=None with lower_bound is fla's `lb * sigmoid(g + dt_bias)`.

Dispatch: a call shape (T, H, HV, K, V, the segment lengths, the flags, the states asked for) is
resolved once to a built variant: the exact built problem, else a built variant of the same heads
and dims whose config the op accepts for these lengths and which renders the very same kernel
(the kernels take T and the lengths as data). Anything the build does not cover (other heads or
dims, q and k not L2-normalised in the kernel where only the l2norm variant is built, the
canonical gate, beta already through a sigmoid, scale other than K^-1/2, training) is a
one-line LoaderError; fla.py's drop-in sends those calls to fla's own chunk_kda instead."""

from __future__ import annotations

import math

import numpy as np

from ..problem import Problem
from .arrays import dtype_of
from .dispatch import _Mode
from .driver import _device
from .errors import LoaderError
from .kernel import BuiltKernel, _meta

_FLAGS = (
    "use_qk_l2norm_in_kernel",
    "use_gate_in_kernel",
    "use_beta_sigmoid_in_kernel",
    "safe_gate",
)
_PER_CALL = ("q", "k", "v", "a", "b", "A_log", "dt_bias", "h0")


class ChunkKDA(BuiltKernel):
    """A built KDA target with chunk_kda's keywords; see the module docstring."""

    RUNTIME_OPTIONS = ("lengths",)

    def __call__(
        self,
        q,
        k,
        v,
        g,
        beta,
        scale: float | None = None,
        initial_state=None,
        output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
        use_gate_in_kernel: bool = False,
        use_beta_sigmoid_in_kernel: bool = False,
        allow_neg_eigval: bool = False,
        safe_gate: bool = False,
        lower_bound: float | None = None,
        disable_recompute: bool = False,
        return_intermediate_states: bool = False,
        state_v_first: bool = False,
        cu_seqlens=None,
        cu_seqlens_cpu=None,
        cp_context=None,
        A_log=None,
        dt_bias=None,
        lengths=None,
        _resolve_only: bool = False,
        **kwargs,
    ):
        """(o [B, T, HV, V], final state or None), as fla's chunk_kda returns them."""
        if lengths is None and cu_seqlens is not None:
            cu = cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens
            cu = cu.tolist()
            lengths = tuple(b - a for a, b in zip(cu[:-1], cu[1:]))
        flags = (use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, safe_gate)
        extra = (
            allow_neg_eigval,
            return_intermediate_states,
            cp_context is not None,
            tuple(kwargs),
        )
        key = (
            _meta(q), _meta(k), _meta(v), _meta(g), _meta(beta), _meta(A_log), _meta(dt_bias),
            None if initial_state is None else _meta(initial_state),
            bool(output_final_state), flags, extra, scale, lower_bound, bool(state_v_first),
            None if lengths is None else tuple(lengths),
        )  # fmt: skip
        hit = self._prepared.get(key)
        if hit is None:
            hit = self._prepared[key] = self._resolve_kda(
                q, k, v, g, beta, A_log, dt_bias, initial_state, output_final_state,
                state_v_first, lengths, (scale, lower_bound, flags, extra),
            )  # fmt: skip
        if _resolve_only:
            return hit
        prep, names, v_first = hit
        if initial_state is not None and not v_first:
            initial_state = initial_state.transpose(-1, -2).contiguous()
        f32 = self._f32
        vals = {"q": q, "k": k, "v": v, "a": g, "b": beta, "h0": initial_state,
                "A_log": A_log if A_log is None or A_log.dtype == f32 else A_log.float(),
                "dt_bias": dt_bias if dt_bias is None or dt_bias.dtype == f32 else dt_bias.float()}  # fmt: skip
        outs = prep([vals[n] for n in names])
        self.calls += 1
        o = outs[0].view(v.shape)
        if not output_final_state:
            return o, None
        hT = outs[prep.out_names.index("hT")]
        return o, (hT if v_first else hT.transpose(-1, -2))

    @property
    def torch_op(self):
        """The custom op (torch_ops.register_kda): its schema, not chunk_kda's keywords."""
        from .torch_ops import register_kda

        return register_kda(self)

    def covers(self, *args, **kwargs) -> tuple[bool, str | None]:
        """(True, None) if a call with these arguments runs the built kernels, else (False, the
        one-line reason): the call shape is resolved (and kept), nothing is launched."""
        try:
            self(*args, _resolve_only=True, **kwargs)
        except LoaderError as exc:
            return False, str(exc)
        return True, None

    # ---------------------------------------------------------- resolving a call shape
    def _refuse(self, why: str):
        raise LoaderError(f"{self.target}: {why}")

    def _resolve_kda(self, q, k, v, g, beta, A_log, dt_bias, h0, want_hT, v_first, lengths, kw):
        """Check a chunk_kda call shape against the build, choose the variant, prepare its launch."""
        import torch

        scale, lb, flags, extra = kw
        o = self.op.OPTIONS
        ref = self.op.host.ref
        if any(extra[:3]):
            self._refuse(
                "allow_neg_eigval, return_intermediate_states and cp_context are not built"
            )
        if extra[3]:
            self._refuse(f"unknown keyword(s) {', '.join(extra[3])} (chunk_kda's are taken)")
        off = [n for n, on in zip(_FLAGS[1:], flags[1:]) if not on]
        if off:
            self._refuse(
                f"{', '.join(off)}=False: the kernels compute the safe gate and sigmoid(beta) "
                "themselves (pass the raw g and beta with these flags True)"
            )
        if lb is None or float(lb) != ref.LOWER_BOUND:
            self._refuse(f"lower_bound={lb}: the kernels are built for {ref.LOWER_BOUND}")
        if q.dim() != 4 or k.shape != q.shape:
            self._refuse(
                f"q, k must be [B, T, H, K] alike, got {list(q.shape)} and {list(k.shape)}"
            )
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        if scale is not None and not math.isclose(scale, K**-0.5, rel_tol=1e-6):
            self._refuse(f"scale={scale}: the kernels are built for K^-1/2 = {K**-0.5:.6g}")
        if lengths is not None and B != 1:
            self._refuse(f"cu_seqlens needs batch size 1 (flatten the batch), got B={B}")
        lengths = tuple(int(n) for n in lengths) if lengths is not None else (T,) * B
        if sum(lengths) != B * T:
            self._refuse(f"cu_seqlens sums to {sum(lengths)}, the inputs hold {B * T} tokens")
        N = len(lengths)
        want = {
            "q": ([B, T, H, K], "bfloat16"), "k": ([B, T, H, K], "bfloat16"),
            "v": ([B, T, HV, V], "bfloat16"), "g": ([B, T, HV, K], "bfloat16"),
            "beta": ([B, T, HV], "bfloat16"),
            "initial_state": ([N, HV, V, K] if v_first else [N, HV, K, V], "float32"),
        }  # fmt: skip
        given = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": h0}
        for name, t in given.items():
            if t is None:
                continue
            shape, dt = want[name]
            if list(t.shape) != shape or dtype_of(t) != dt:
                self._refuse(
                    f"{name} is {dtype_of(t)}{list(t.shape)}, expected {dt}{shape} (chunk_kda's layout)"
                )
        small = {"A_log": (A_log, [HV]), "dt_bias": (dt_bias, [HV * K])}
        for name, (t, n) in small.items():
            if t is not None and t.numel() != n[0]:
                self._refuse(f"{name} has {t.numel()} values, expected {n[0]}")
        device = q.device
        arrays = {
            n: t for n, t in {**given, "A_log": A_log, "dt_bias": dt_bias}.items() if t is not None
        }
        ordinal = self._device_of(arrays, _Mode({}, tuple(arrays)))
        if ordinal is None:
            self._refuse("no CUDA GPU is visible, and the built kernels need one")
        for name, t in arrays.items():
            if not t.is_contiguous() or t.data_ptr() % 16:
                self._refuse(
                    f"input {name} is not contiguous and 16-byte aligned; pass {name}.contiguous()"
                )
        opts = {
            "lengths": lengths if N > 1 else None,
            "hv": HV if HV != H else None,
            "K": K,
            "V": V,
            "l2norm": bool(flags[0]),  # use_qk_l2norm_in_kernel: a build of its own, not a no-op
        }
        opts = {n: v_ for n, v_ in opts.items() if v_ != o[n]}
        entry, problem = None, None
        for states in ({"initial_state": h0 is not None, "final_state": bool(want_hT)}, {}):
            extra = {n: s for n, s in states.items() if s != o[n]}
            problem = Problem.make(self.op.NAME, "bfloat16", (B * T, H), {**opts, **extra})
            if (entry := self.select(problem)) is not None:
                break
        if entry is None:
            raw = "" if flags[0] else " with use_qk_l2norm_in_kernel=False (an l2norm=false build)"
            self._refuse(
                f"no built variant covers {problem.label()}{raw}; built (T x H, any lengths): "
                f"{self._built_heads()} (add it to kernelfile.toml and rebuild)"
            )
        d = self.op.dims(problem)
        f32 = dict(dtype=torch.float32, device=device)
        held = {n: torch.as_tensor(a).to(device) for n, a in self.op.host._layout(
            np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)).items()}  # fmt: skip
        held["g"] = torch.zeros(1, **f32)  # the precomputed gate of gate="given" only
        held["hT_unused"] = torch.zeros(1, **f32)
        if A_log is None:  # fla: lb * sigmoid(g + dt_bias) = ours with exp(A_log) = 1
            A_log = held["A_log"] = torch.zeros(HV, **f32)
        if dt_bias is None:
            dt_bias = held["dt_bias"] = torch.zeros(HV * K, **f32)
        if d["h0"] and h0 is None:
            held["h0"] = torch.zeros(N, HV, V, K, **f32)
        elif not d["h0"]:
            held["h0"] = torch.zeros(1, **f32)
        self._f32 = torch.float32
        per_call = {"q": q, "k": k, "v": v, "a": g, "b": beta,
                    "A_log": A_log.float(), "dt_bias": dt_bias.float()}  # fmt: skip
        if "h0" not in held:
            per_call["h0"] = h0 if v_first else h0.transpose(-1, -2).contiguous()
        names = [n for n in _PER_CALL if n in per_call and n not in held]
        prep = self.prepare(entry, problem, _device(ordinal), names, {**held, **per_call})
        return prep, names, v_first

    def _built_heads(self) -> str:
        labels = set()
        for e in self.entries:
            p = e.problem
            opts = ",".join(f"{k}={v}" for k, v in sorted(p["options"].items()) if k != "lengths")
            labels.add("x".join(map(str, p["shape"])) + (f"{{{opts}}}" if opts else ""))
        return ", ".join(sorted(labels))
