#!/usr/bin/env python3
"""CPU: what storing U^T in f16 (instead of fp32) in the workspace costs in accuracy, before any kernel
is written. The recurrence is emulated from the workspace by ops/kda/workspace.simulate (operands
rounded as the kernel rounds them, float64 accumulation); U is rounded to f16 in the blob, everything
else as today, and both are compared with the float64 token recurrence (the op's gate: relative RMS
of o and hT <= 5e-3; the locked kernels measure ~1.7e-3 / 3.6e-4).

    python3 lab/kda/wg/u_f16_error.py [--T 2048] [--H 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "ops" / "kda"))

import reference as ref  # noqa: E402
import workspace as wsl  # noqa: E402


def u_to_f16(ws: np.ndarray, K: int, V: int) -> np.ndarray:
    """The blob with its U^T region (fp32) rounded to f16 and back."""
    sz = wsl.sizes(K, V)
    out = ws.copy()
    u = np.ascontiguousarray(out[..., sz["U"] : sz["BLOB"]]).view(np.float32)
    out[..., sz["U"] : sz["BLOB"]] = u.astype(np.float16).astype(np.float32).view(np.uint8)
    return out


def u_from_v(ch, p: dict, dtype) -> np.ndarray:
    """U^T as the recurrence would form it from v (bf16, exact in the case) and T_inv diag(beta)
    stored in `dtype` (np.float16, or bf16 emulated by truncating to 8 mantissa bits with rounding),
    accumulated in float64: U [T, HV, V]."""
    U = np.zeros_like(ch.U)
    for t0, m in zip(ch.chunk_start, ch.chunk_len):
        sl = slice(int(t0), int(t0 + m))
        Ti = ch.T_inv[sl][:, :, :m].transpose(1, 0, 2)  # [HV, r, s]
        Tb = Ti * p["beta"][sl].T[:, None, :]  # T_inv diag(beta)
        Tb = round_to(Tb, dtype)
        U[sl] = np.einsum("hrs,shv->rhv", Tb, p["v"][sl])
    return U


def round_to(x: np.ndarray, dtype) -> np.ndarray:
    if dtype == "bf16":
        b = np.ascontiguousarray(x, np.float32).view(np.uint32)
        b = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)  # round to nearest even
        return b.view(np.float32).astype(np.float64)
    return x.astype(dtype).astype(np.float64)


def case_args(ap: argparse.ArgumentParser, H: int) -> None:
    """The case options both emulations take (prep_bf16_error.py too): --T, --H, --lengths, --v-scale."""
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--H", type=int, default=H)
    ap.add_argument("--lengths", default="", help="comma-separated segments (default: one of T)")
    ap.add_argument(
        "--v-scale", type=float, default=1.0, help="scale of v (larger values: f16 range)"
    )


def lengths_of(a: argparse.Namespace) -> list[int]:
    return [int(x) for x in a.lengths.split(",")] if a.lengths else [a.T]


def reference_case(lengths: list[int], H: int, seed: int, **kw):
    """A make_case() case, preprocessed: (p, its float64 token recurrence (o, hT), its chunked form)."""
    p = ref.preprocess(ref.make_case(lengths, H, seed=seed, **kw))
    args = {n: p[n] for n in ("q", "k", "v", "g", "beta", "scale", "cu_seqlens", "h0")}
    return p, ref.recurrent(**args), ref.chunked(**args)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    case_args(ap, H=4)
    a = ap.parse_args()
    lengths = lengths_of(a)
    print("| case | U stored as | o rel RMS | hT rel RMS |")
    print("|---|---|---:|---:|")
    for seed in (0, 1):
        p, (o_ref, h_ref), ch = reference_case(lengths, a.H, seed, v_scale=a.v_scale)
        ws = wsl.encode(ch, "f16")
        K, V = ch.hT.shape[3], ch.hT.shape[2]
        from_v = {
            f"from v, T_inv diag(beta) in {n}": wsl.encode(
                dataclasses.replace(ch, U=u_from_v(ch, p, dt)), "f16"
            )
            for n, dt in (("f16", np.float16), ("bf16", "bf16"))
        }
        variants = {"fp32 (today)": ws, "f16": u_to_f16(ws, K, V), **from_v}
        for label, blob in variants.items():
            o, hT = wsl.simulate(blob, ch, p["h0"], p["cu_seqlens"], "f16")
            name = f"H{a.H} {'+'.join(map(str, lengths))} v x{a.v_scale:g} seed {seed}"
            print(
                f"| {name} | {label} | {ref.rel_rms(o, o_ref):.3e} | {ref.rel_rms(hT, h_ref):.3e} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
