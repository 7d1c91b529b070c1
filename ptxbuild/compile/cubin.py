"""Resource usage read from a cubin itself (ELF64, `.nv.info` attributes), for when the linker's verbose log has none.

Seen on the H200 machine: a second compile of identical PTX came back with no resource report in nvJitLink's info log (a
cache hit, it seems), so registers and spills parsed as 0, and a spilling candidate would have passed the spill filter.
The cubin always carries each kernel's register count and stack sizes (the EIATTR_* records below).
"""

from __future__ import annotations

import struct

EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12  # the frame including the callees' (a __noinline__ helper's locals)
EIATTR_REGCOUNT = 0x2F
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4


class CubinError(ValueError):
    """Not a 64-bit little-endian ELF, or its sections do not parse."""


def _name(elf: bytes, at: int) -> str:
    """The NUL-terminated name at offset `at`."""
    return elf[at : elf.index(b"\0", at)].decode(errors="replace")


def _sections(elf: bytes) -> dict[str, tuple]:
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise CubinError("not a 64-bit little-endian ELF")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    if shoff + shnum * shentsize > len(elf) or shstrndx >= shnum:
        raise CubinError("section headers out of range")
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = hdrs[shstrndx][4]
    return {_name(elf, names + h[0]): h for h in hdrs}


def _symbol_index(elf: bytes, sections: dict, name: str) -> int | None:
    symtab, strtab = sections.get(".symtab"), sections.get(".strtab")
    if symtab is None or strtab is None:
        return None
    for i in range(symtab[5] // 24):
        st_name = struct.unpack_from("<I", elf, symtab[4] + 24 * i)[0]
        if _name(elf, strtab[4] + st_name) == name:
            return i
    return None


def _attributes(data: bytes):
    """(attribute, payload) of each .nv.info record."""
    i = 0
    while i + 2 <= len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == _EIFMT_SVAL:
            size = struct.unpack_from("<H", data, i + 2)[0]
            yield attr, data[i + 4 : i + 4 + size]
            i += 4 + size
        elif fmt == _EIFMT_HVAL:
            yield attr, data[i + 2 : i + 4]
            i += 4
        elif fmt == _EIFMT_BVAL:
            i += 4
        elif fmt == _EIFMT_NVAL:
            i += 2
        else:
            raise CubinError(f".nv.info: unknown record format {fmt}")


def resources(cubin: bytes, entry: str) -> dict[str, int] | None:
    """{"registers", "stack"} of kernel `entry` (stack: the larger of its own frame and the frame
    with its callees), or None when the cubin does not say; CubinError when it does not parse."""
    try:
        secs = _sections(cubin)
        sym = _symbol_index(cubin, secs, entry)
        info = secs.get(".nv.info")
        if sym is None or info is None:
            return None
        out = {"stack": 0}
        for attr, payload in _attributes(cubin[info[4] : info[4] + info[5]]):
            if (
                attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE, EIATTR_MIN_STACK_SIZE)
                and len(payload) == 8
            ):
                index, value = struct.unpack("<II", payload)
                if index != sym:
                    continue
                if attr == EIATTR_REGCOUNT:
                    out["registers"] = value
                else:
                    out["stack"] = max(out["stack"], value)
    except CubinError:
        raise
    except (struct.error, ValueError, IndexError) as exc:
        raise CubinError(f"cubin does not parse: {exc}") from None
    return out if "registers" in out else None
