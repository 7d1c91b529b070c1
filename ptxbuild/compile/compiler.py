"""Compile stage: CUDA C++ -> PTX (NVRTC) -> cubin (nvJitLink), with the resources ptxas reports."""

from __future__ import annotations

import contextlib
import re
import sys
from dataclasses import asdict, dataclass, replace

from ..declare import memo
from ..errors import BuildFailed, ToolError
from ..keys import COMPILER_WHEELS, installed_version
from ..problem import Binary, Kernel


class CompileError(BuildFailed):
    """The candidate did not compile; the message is the compiler log."""


class ToolchainMissing(ToolError, RuntimeError):
    """The CUDA compiler wheels are not installed."""


INSTALL_HINT = (
    "pip install 'cuda-bindings>=13.0,<14' 'nvidia-cuda-nvrtc==13.0.*' 'nvidia-nvjitlink==13.0.*'"
)


def _bindings():
    try:
        from cuda.bindings import nvjitlink, nvrtc
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ToolchainMissing(
            f"the CUDA compiler is not installed ({exc}); run: {INSTALL_HINT}"
        ) from exc
    return nvrtc, nvjitlink


@dataclass(frozen=True)
class Toolchain:
    """Identity of the compiler: hashed into every compile key."""

    nvrtc: str
    nvjitlink: str
    bindings: str  # the Python wrapper: recorded, not hashed (it does not change the output)
    nvrtc_wheel: str | None = None  # finer than NVRTC's own major.minor, when installed from pip
    nvjitlink_wheel: str | None = None

    def key(self) -> dict[str, str | None]:
        """Every field but the bindings', in order."""
        return {k: v for k, v in asdict(self).items() if k != "bindings"}

    def __str__(self) -> str:
        return f"NVRTC {self.nvrtc}, nvJitLink {self.nvjitlink}"


def toolchain() -> Toolchain:
    """The installed compiler's identity; the memo's (declare/memo.py) where the compiler wheels
    are the ones it was read from (importing the bindings costs plan and no-op builds ~0.1 s)."""
    wheels = [installed_version(n) for n in ("cuda-bindings", *COMPILER_WHEELS)]
    book, key = memo.book("toolchain"), memo.digest(wheels, sys.prefix)
    hit = book.get("toolchain", key) if None not in wheels else None
    if isinstance(hit, dict):
        with contextlib.suppress(TypeError):
            return Toolchain(**hit)
    nvrtc, nvjitlink = _bindings()
    import cuda.bindings

    _, major, minor = nvrtc.nvrtcVersion()
    try:
        jl = nvjitlink.version()
        jl_ver = f"{jl[0]}.{jl[1]}"
    except Exception:  # older bindings have no version()
        jl_ver = "unknown"
    tc = Toolchain(
        nvrtc=f"{major}.{minor}",
        nvjitlink=jl_ver,
        bindings=cuda.bindings.__version__,
        nvrtc_wheel=installed_version("nvidia-cuda-nvrtc"),
        nvjitlink_wheel=installed_version("nvidia-nvjitlink"),
    )
    if None not in wheels:
        book.put("toolchain", key, asdict(tc))
    return tc


_RES = {
    "registers": re.compile(r"Used (\d+) registers"),
    "spill_store": re.compile(r"(\d+) bytes spill stores"),
    "spill_load": re.compile(r"(\d+) bytes spill loads"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
    "smem": re.compile(r"(\d+) bytes smem"),
}


def parse_resources(log: str, entry: str | None = None) -> dict[str, int]:
    """Registers, spills, stack and static shared memory from a ptxas verbose log: of `entry`'s section if the log
    has one (a source with several kernels lists each, the entry not necessarily first), else its first figures."""
    if entry:
        parts = re.split(r"(?=Compiling entry function ')", log)
        log = next((p for p in parts if p.startswith(f"Compiling entry function '{entry}'")), log)
    found = {name: rx.search(log) for name, rx in _RES.items()}
    return {name: int(m.group(1)) if m else 0 for name, m in found.items()}


def compile_kernel(kernel: Kernel, arch: str) -> Binary:
    """Render to PTX with NVRTC, then to cubin with nvJitLink for `arch` (e.g. sm_90a)."""
    nvrtc, nvjitlink = _bindings()
    compute = arch.replace("sm_", "compute_")
    err, prog = nvrtc.nvrtcCreateProgram(kernel.source.encode(), b"candidate.cu", 0, [], [])
    if int(err) != 0:
        raise CompileError(f"nvrtcCreateProgram failed ({err})")
    try:
        opts = [
            o.encode()
            for o in (
                f"--gpu-architecture={compute}",
                "-std=c++17",
                "-default-device",
                *kernel.flags,
            )
            if o != "--use_fast_math=false"
        ]  # NVRTC has no =false form: fast math stays off unless asked for
        res = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, log_size = nvrtc.nvrtcGetProgramLogSize(prog)
        log_buf = b" " * log_size
        nvrtc.nvrtcGetProgramLog(prog, log_buf)
        nvrtc_log = log_buf.decode(errors="replace").rstrip("\x00 \n")
        if int(res[0]) != 0:
            raise CompileError(nvrtc_log or "nvrtc failed without a log")
        _, ptx_size = nvrtc.nvrtcGetPTXSize(prog)
        ptx_buf = b" " * ptx_size
        nvrtc.nvrtcGetPTX(prog, ptx_buf)
        ptx = ptx_buf.rstrip(b"\x00").decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    if f".entry {kernel.entry}(" not in ptx and f".entry {kernel.entry} (" not in ptx:
        raise CompileError(
            f'entry point {kernel.entry!r} not found in the PTX (is it extern "C" __global__?)'
        )
    cubin, link_log = ptx_to_cubin(ptx, arch)
    res = parse_resources(link_log, kernel.entry)
    return with_resources(
        Binary(
            arch=arch,
            entry=kernel.entry,
            ptx=ptx,
            cubin=cubin,
            registers=res["registers"],
            spill_bytes=res["spill_store"] + res["spill_load"],
            smem_static_bytes=res["smem"],
            local_bytes=res["stack"],
            log=(nvrtc_log + "\n" + link_log).strip(),
        )
    )


def with_resources(binary: Binary) -> Binary:
    """`binary` with its resources taken from the cubin when its log has no resource report (a fresh
    link that returned none, or a row cached before this fallback existed, stored with 0s): registers
    and stack frame. A cubin has no spill bytes, so any stack frame counts as spilled (conservative:
    our kernels keep no local arrays) and the spill filter holds."""
    log, entry = binary.log or "", binary.entry
    if (
        not binary.cubin
        or not binary.cubin.startswith(b"\x7fELF")
        or _RES["registers"].search(log)
        or "resources read from the cubin" in log
    ):
        return binary
    from . import cubin as elf

    try:
        found = elf.resources(binary.cubin, entry)
    except elf.CubinError as exc:
        raise CompileError(
            f"no resource report for {entry!r} in the linker's log, and {exc}"
        ) from None
    if found is None:
        raise CompileError(
            f"no resource report for {entry!r}: not in the linker's log, not in the cubin"
        )
    stack = found.get("stack", 0)
    note = f"\n(resources read from the cubin: the linker's log had none: {found})"
    return replace(
        binary,
        registers=found["registers"],
        spill_bytes=stack,
        local_bytes=stack,
        log=(log + note).strip(),
    )


def ptx_to_cubin(ptx: str, arch: str) -> tuple[bytes, str]:
    """Assemble PTX to cubin with nvJitLink; returns (cubin, info log with the resource report)."""
    _, nvjitlink = _bindings()
    handle = nvjitlink.create(2, [f"-arch={arch}", "-verbose"])
    try:
        data = ptx.encode()
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "candidate.ptx")
            nvjitlink.complete(handle)
        except Exception as exc:
            buf = bytearray(nvjitlink.get_error_log_size(handle))
            nvjitlink.get_error_log(handle, buf)
            raise CompileError(
                f"ptxas: {bytes(buf).decode(errors='replace').strip() or exc}"
            ) from None
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        info = bytearray(nvjitlink.get_info_log_size(handle))
        nvjitlink.get_info_log(handle, info)
        return bytes(cubin), bytes(info).decode(errors="replace").rstrip("\x00").strip()
    finally:
        nvjitlink.destroy(handle)
