"""Element types: names, sizes, and bf16 <-> float32 conversion on numpy or cupy arrays (bfloat16 has no
numpy/cupy dtype, so bf16 tensors are stored as uint16 bit patterns)."""

from __future__ import annotations

DTYPES = ("bfloat16", "float16", "float32")
SIZE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}
ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
}


def storage_dtype(name: str, xp):
    """The array dtype that holds `name` on host/device (bf16 -> uint16)."""
    return {
        "bfloat16": xp.uint16,
        "float16": xp.float16,
        "float32": xp.float32,
        "float64": xp.float64,
    }[name]


def to_float(arr, name: str, xp):
    """Upcast a stored tensor of element type `name` to float32."""
    return (
        (arr.astype(xp.uint32) << 16).view(xp.float32)
        if name == "bfloat16"
        else arr.astype(xp.float32)
    )


def from_float(arr, name: str, xp):
    """Round a float array to element type `name` (round to nearest even for bf16)."""
    if name == "bfloat16":
        bits = xp.ascontiguousarray(arr, dtype=xp.float32).view(xp.uint32)
        rounding = ((bits >> 16) & 1) + 0x7FFF
        out = ((bits + rounding) >> 16).astype(xp.uint16)
        return xp.where(xp.isnan(arr), xp.uint16(0x7FC0), out)
    return arr.astype(storage_dtype(name, xp))
