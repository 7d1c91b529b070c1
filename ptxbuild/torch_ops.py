"""Built kernels as PyTorch custom ops, so they work under torch.compile (the public path; the code
is ptxbuild/runtime/torch_ops.py, inside the runtime leg). Importing this module imports torch.

    from ptxbuild.torch_ops import register
    rms = register(ptxbuild.load("rmsnorm@h200"))      # torch.ops.ptxbuild.rmsnorm_h200
"""

from .runtime.torch_ops import NAMESPACE, module_callable, op_name, register, register_kda

__all__ = ["NAMESPACE", "module_callable", "op_name", "register", "register_kda"]
