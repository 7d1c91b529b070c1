"""The GPU's identity (name, SMs, memory, clocks, driver, CUDA) and how it matches kernelfile GPU names."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass

_VENDOR = {"nvidia", "geforce", "tesla", "quadro"}
_JOIN = {"rtx", "gtx", "titan"}


@dataclass(frozen=True)
class Fingerprint:
    name: str  # "NVIDIA H200"
    cc: str  # "sm_90"
    sm_count: int
    memory_bytes: int
    l2_bytes: int = 0
    sm_clock_mhz: int = 0  # max clocks (nvidia-smi), else what the runtime reports, else 0
    mem_clock_mhz: int = 0
    driver: str = ""  # "580.95.05" (nvidia-smi), else the CUDA driver version
    cuda_driver: str = ""  # "13.0": highest CUDA the driver supports
    cuda_runtime: str = ""  # "13.0": the runtime cupy was built against

    @property
    def model(self) -> str:
        return model_of(self.name)

    def key(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return (
            f"{self.name} ({self.cc}, {self.sm_count} SMs, {self.memory_bytes / 2**30:.0f} GiB, "
            f"{self.sm_clock_mhz}/{self.mem_clock_mhz} MHz, driver {self.driver}, CUDA {self.cuda_runtime})"
        )


def model_of(name: str) -> str:
    """The model token of a GPU name: "NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA GH200 480GB" -> "gh200",
    "NVIDIA GeForce RTX 4090" -> "rtx4090", "h100-sxm" -> "h100"."""
    toks = [t for t in re.split(r"[\s_\-/]+", name.lower()) if t and t not in _VENDOR]
    if not toks:
        return ""
    return toks[0] + toks[1] if toks[0] in _JOIN and len(toks) > 1 else toks[0]


def cc_of(arch: str) -> str:
    """ "sm_90a" / "sm_100f" / "compute_90" -> "sm_90": the compute capability a binary needs."""
    m = re.search(r"(\d+)", arch)
    return f"sm_{m.group(1)}" if m else ""


def _version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}" if v else ""


def _mhz(text: str) -> int:
    m = re.search(r"(\d+)", text or "")
    return int(m.group(1)) if m else 0


def from_props(
    props: dict, driver_version: int = 0, runtime_version: int = 0, smi: str | None = None
) -> Fingerprint:
    """A fingerprint from cudaGetDeviceProperties, cudaDriverGetVersion, cudaRuntimeGetVersion and smi_line()'s line."""
    name = props.get("name", b"")
    name = name.decode(errors="replace").rstrip("\x00") if isinstance(name, bytes) else str(name)
    sm_mhz, mem_mhz = props.get("clockRate", 0) // 1000, props.get("memoryClockRate", 0) // 1000
    driver = _version(driver_version)
    parts = [p.strip() for p in (smi or "").split(",")]
    if len(parts) >= 4:
        sm_mhz, mem_mhz, driver = (
            _mhz(parts[1]) or sm_mhz,
            _mhz(parts[2]) or mem_mhz,
            parts[3] or driver,
        )
    return Fingerprint(
        name=name,
        cc=f"sm_{props.get('major', 0)}{props.get('minor', 0)}",
        sm_count=int(props.get("multiProcessorCount", 0)),
        memory_bytes=int(props.get("totalGlobalMem", 0)),
        l2_bytes=int(props.get("l2CacheSize", 0)),
        sm_clock_mhz=int(sm_mhz),
        mem_clock_mhz=int(mem_mhz),
        driver=driver,
        cuda_driver=_version(driver_version),
        cuda_runtime=_version(runtime_version),
    )


def smi_line(device: int = 0) -> str | None:
    """nvidia-smi's name, max clocks and driver for one GPU; None when nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [
                exe,
                "--query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version",
                "--format=csv,noheader",
                f"--id={device}",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
        lines = out.stdout.strip().splitlines()
        return lines[0] if out.returncode == 0 and lines else None
    except Exception:
        return None


def read(device: int = 0) -> Fingerprint:
    """The fingerprint of one GPU, read with cupy in this process (initializes CUDA)."""
    import cupy

    rt = cupy.cuda.runtime
    return from_props(
        rt.getDeviceProperties(device),
        rt.driverGetVersion(),
        rt.runtimeGetVersion(),
        smi_line(device),
    )


def match_gpu(fp: Fingerprint, gpu_name: str, catalog_entry: dict) -> str | None:
    """How well this GPU satisfies a kernelfile GPU (`gpu_name`, e.g. "h200", with its catalog entry: "arch" and
    optionally "models"/"names" (aliases) and "sm_count"/"memory_gb" (an exact SKU)). "exact": the model and every
    pinned SKU field match; "model": the model matches ("NVIDIA H200" is h200; H100 SXM and PCIe are h100; GH200 is not
    h200); "arch": another model with the same compute capability; None: it cannot run this target's binaries."""
    arch = catalog_entry.get("arch", "")
    if arch and cc_of(arch) != fp.cc:
        return None
    models = {model_of(gpu_name)} | {
        model_of(m) for m in (*catalog_entry.get("models", ()), *catalog_entry.get("names", ()))
    }
    if fp.model in models:
        pins = {"sm_count": fp.sm_count, "memory_gb": round(fp.memory_bytes / 2**30)}
        pinned = [k for k in pins if k in catalog_entry]
        same = all(
            abs(int(catalog_entry[k]) - pins[k]) <= (1 if k == "memory_gb" else 0) for k in pinned
        )
        return "exact" if pinned and same else "model"
    return "arch" if arch else None
