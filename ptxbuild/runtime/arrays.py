"""Arrays of torch / cupy as the op's functions see them (cupy's `.data.ptr`, numpy dtypes), and host
copies for the reference fallback. torch and cupy are imported only when an array of theirs is seen."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

NP_TO_DTYPE = {"uint16": "bfloat16"}  # numpy dtype -> ptxbuild name, where they differ


def kind(arr) -> str:
    """The top-level module of an array's type: "torch", "cupy", "numpy", ..."""
    return type(arr).__module__.split(".")[0]


def dtype_of(arr) -> str:
    """The ptxbuild element type of a torch tensor / cupy / numpy array (16-bit unsigned = bf16 bits)."""
    if kind(arr) == "torch":
        return str(arr.dtype).removeprefix("torch.")
    return NP_TO_DTYPE.get(str(arr.dtype), str(arr.dtype))


def contiguous(arr) -> bool:
    return bool(arr.is_contiguous() if kind(arr) == "torch" else arr.flags.c_contiguous)


def strides(arr) -> tuple:
    if kind(arr) == "torch":
        return tuple(arr.stride())
    return tuple(s // arr.itemsize for s in arr.strides)


class Ptr:
    """What op.kernel_args sees for a torch tensor: cupy's `.data.ptr` plus shape and storage dtype.
    `origin` names the tensor it was made from (a slice keeps its parent's origin), so a prepared
    launch can map each pointer argument back to a tensor and an offset."""

    def __init__(self, tensor, origin=None):
        self.tensor, self.origin = tensor, origin
        self.data = SimpleNamespace(ptr=int(tensor.data_ptr()))
        self.shape = tuple(tensor.shape)
        self.size = int(tensor.numel())
        self.dtype = np.dtype({"bfloat16": "uint16"}.get(dtype_of(tensor), dtype_of(tensor)))
        self.nbytes = self.size * self.dtype.itemsize

    def __getitem__(self, key):
        return Ptr(self.tensor[key], self.origin)

    def __len__(self) -> int:
        return self.shape[0]


class TorchXp:
    """Just enough of numpy's namespace for op.make_outputs to allocate torch tensors on a device."""

    uint8, uint16, float16, float32, float64 = "uint8", "bfloat16", "float16", "float32", "float64"
    int32, int64 = "int32", "int64"

    def __init__(self, torch, device):
        self._torch, self._device = torch, device

    def torch_dtype(self, dtype):
        name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
        return getattr(self._torch, {"uint16": "bfloat16"}.get(name, name))

    def empty(self, shape, dtype="float32"):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return self._torch.empty(shape, dtype=self.torch_dtype(dtype), device=self._device)

    zeros = (
        empty  # outputs are written by the kernels (the build verified them on poisoned buffers)
    )


def to_numpy(arr):
    if kind(arr) == "torch":
        import torch

        t = arr.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16)
        return t.numpy()
    return arr.get() if kind(arr) == "cupy" else np.asarray(arr)


def from_numpy(a: np.ndarray, like):
    if kind(like) == "torch":
        import torch

        if a.dtype == np.uint16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(like.device)
        return torch.from_numpy(a).to(like.device)
    if kind(like) == "cupy":
        import cupy

        return cupy.asarray(a)
    return a
