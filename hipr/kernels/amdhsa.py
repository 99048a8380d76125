"""Kernel parameter layouts read from an AMD GPU code object's metadata.

A HIP code object (an ELF for ``amdgcn-amd-amdhsa``, alone or inside a clang offload
bundle) carries, in an ``NT_AMDGPU_METADATA`` note, a MessagePack map whose
``amdhsa.kernels`` list describes each kernel's arguments: ``.offset`` and ``.size`` in the
kernel argument segment and a ``.value_kind`` (``global_buffer`` for a pointer to global
memory, ``by_value`` for a value, ``hidden_*`` for arguments the runtime fills in itself).
That is what a client given bare argument pointers (HIP's ``kernelParams``) needs to pack
them, since HIP before 7.2 has no call that reports it (CUDA has ``cuFuncGetParamInfo``).

Pure parsing: bytes in, layouts out; malformed input raises :class:`MetadataError` and
never reads past the bytes given. Verified on synthetic code objects only (no AMD GPU was
at hand): tests/kernels/test_amdhsa.py builds them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

#: ELF note type of AMDGPU code object v3+ metadata, owner "AMDGPU".
NT_AMDGPU_METADATA = 32
_BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
_MAX_DEPTH = 32


class MetadataError(ValueError):
    """The code object or its metadata is malformed."""


@dataclass(frozen=True)
class KernelArg:
    """One explicit argument of a kernel: where it sits, how large, whether a pointer."""

    offset: int
    size: int
    pointer: bool


# --- MessagePack (the subset the metadata uses, bounded) ----------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise MetadataError("truncated MessagePack data")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def value(self, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise MetadataError("MessagePack nested too deeply")
        b = self.take(1)[0]
        if b <= 0x7F:
            return b
        if b >= 0xE0:
            return b - 0x100
        if 0x80 <= b <= 0x8F:
            return self._map(b & 0x0F, depth)
        if 0x90 <= b <= 0x9F:
            return self._array(b & 0x0F, depth)
        if 0xA0 <= b <= 0xBF:
            return self._str(b & 0x1F)
        simple: dict[int, Any] = {0xC0: None, 0xC2: False, 0xC3: True}
        if b in simple:
            return simple[b]
        if b in (0xC4, 0xC5, 0xC6):  # bin 8/16/32
            return self.take(self.uint(1 << (b - 0xC4)))
        if b in (0xCA, 0xCB):
            return struct.unpack(">f" if b == 0xCA else ">d", self.take(4 if b == 0xCA else 8))[0]
        if 0xCC <= b <= 0xCF:  # uint 8..64
            return self.uint(1 << (b - 0xCC))
        if 0xD0 <= b <= 0xD3:  # int 8..64
            n = 1 << (b - 0xD0)
            return int.from_bytes(self.take(n), "big", signed=True)
        if b in (0xD9, 0xDA, 0xDB):  # str 8/16/32
            return self._str(self.uint(1 << (b - 0xD9)))
        if b in (0xDC, 0xDD):
            return self._array(self.uint(2 if b == 0xDC else 4), depth)
        if b in (0xDE, 0xDF):
            return self._map(self.uint(2 if b == 0xDE else 4), depth)
        raise MetadataError(f"MessagePack type 0x{b:02x} is not used by AMDGPU metadata")

    def _str(self, n: int) -> str:
        return self.take(n).decode("utf-8", "replace")

    def _array(self, n: int, depth: int) -> list[Any]:
        if n > len(self.data) - self.pos:  # each item takes at least one byte
            raise MetadataError("MessagePack array longer than its data")
        return [self.value(depth + 1) for _ in range(n)]

    def _map(self, n: int, depth: int) -> dict[Any, Any]:
        if 2 * n > len(self.data) - self.pos:
            raise MetadataError("MessagePack map longer than its data")
        out: dict[Any, Any] = {}
        for _ in range(n):
            key = self.value(depth + 1)
            if isinstance(key, list | dict):
                raise MetadataError("MessagePack map key is not a scalar")
            out[key] = self.value(depth + 1)
        return out


def unpackb(data: bytes) -> Any:
    """One MessagePack value from ``data`` (the whole of it)."""
    reader = _Reader(bytes(data))
    value = reader.value()
    if reader.pos != len(reader.data):
        raise MetadataError("trailing bytes after the MessagePack value")
    return value


# --- ELF notes and offload bundles --------------------------------------------------------


def _u(data: bytes, offset: int, size: int) -> int:
    if offset < 0 or offset + size > len(data):
        raise MetadataError("ELF structure outside the file")
    return int.from_bytes(data[offset : offset + size], "little")


def _align4(n: int) -> int:
    return (n + 3) & ~3


def _notes(data: bytes, start: int, size: int) -> list[tuple[bytes, int, bytes]]:
    """(owner, type, descriptor) of each note in ``data[start:start+size]``."""
    out = []
    pos, end = start, start + size
    if end > len(data):
        raise MetadataError("ELF note section outside the file")
    while pos + 12 <= end:
        namesz, descsz, ntype = _u(data, pos, 4), _u(data, pos + 4, 4), _u(data, pos + 8, 4)
        name_at = pos + 12
        desc_at = name_at + _align4(namesz)
        if desc_at + descsz > end:
            raise MetadataError("ELF note larger than its section")
        out.append((data[name_at : name_at + namesz].rstrip(b"\0"), ntype,
                    data[desc_at : desc_at + descsz]))  # fmt: skip
        pos = desc_at + _align4(descsz)
    return out


def _elf_metadata(data: bytes) -> dict[str, Any] | None:
    """The metadata map of an AMDGPU ELF code object; None if it has none."""
    if data[:4] != b"\x7fELF":
        raise MetadataError("not an ELF file")
    if len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise MetadataError("not a 64-bit little-endian ELF file")
    found: list[tuple[int, int]] = []
    shoff, shentsize, shnum = _u(data, 40, 8), _u(data, 58, 2), _u(data, 60, 2)
    if shoff and shnum:
        if shentsize < 64:
            raise MetadataError("ELF section headers too small")
        for i in range(shnum):
            sh = shoff + i * shentsize
            if _u(data, sh + 4, 4) == 7:  # SHT_NOTE
                found.append((_u(data, sh + 24, 8), _u(data, sh + 32, 8)))
    phoff, phentsize, phnum = _u(data, 32, 8), _u(data, 54, 2), _u(data, 56, 2)
    if not found and phoff and phnum:
        if phentsize < 56:
            raise MetadataError("ELF program headers too small")
        for i in range(phnum):
            ph = phoff + i * phentsize
            if _u(data, ph, 4) == 4:  # PT_NOTE
                found.append((_u(data, ph + 8, 8), _u(data, ph + 32, 8)))
    for start, size in found:
        for owner, ntype, desc in _notes(data, start, size):
            if owner == b"AMDGPU" and ntype == NT_AMDGPU_METADATA:
                meta = unpackb(desc)
                if not isinstance(meta, dict):
                    raise MetadataError("AMDGPU metadata is not a map")
                return meta
    return None


def _bundle_entries(data: bytes) -> list[tuple[str, bytes]]:
    """(triple, image) of each entry of a clang offload bundle."""
    count = _u(data, 24, 8)
    if count > 4096:
        raise MetadataError("offload bundle with too many entries")
    out, pos = [], 32
    for _ in range(count):
        offset, size, triple_len = _u(data, pos, 8), _u(data, pos + 8, 8), _u(data, pos + 16, 8)
        triple_at = pos + 24
        if triple_at + triple_len > len(data) or offset + size > len(data):
            raise MetadataError("offload bundle entry outside the file")
        out.append((data[triple_at : triple_at + triple_len].decode("ascii", "replace"),
                    data[offset : offset + size]))  # fmt: skip
        pos = triple_at + triple_len
    return out


def code_object_metadata(image: bytes) -> dict[str, Any] | None:
    """The AMDGPU metadata map of ``image`` (an ELF code object, or the first amdgcn entry
    of a clang offload bundle that has metadata); None for an image that is not AMD's
    (a CUBIN, PTX) or has no metadata note."""
    data = bytes(image)
    if data.startswith(_BUNDLE_MAGIC):
        for triple, entry in _bundle_entries(data):
            if "amdgcn" in triple and entry[:4] == b"\x7fELF":
                meta = _elf_metadata(entry)
                if meta is not None:
                    return meta
        return None
    if data[:4] != b"\x7fELF":
        return None
    return _elf_metadata(data)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MetadataError(f"{what} is not a non-negative integer: {value!r}")
    return value


def kernel_layouts(image: bytes) -> dict[str, list[KernelArg]]:
    """Kernel name -> its explicit arguments in order (``hidden_*`` ones left out, which
    the runtime fills in), from ``image``'s ``amdhsa.kernels``; empty for an image without
    AMDGPU metadata."""
    meta = code_object_metadata(image)
    if meta is None:
        return {}
    kernels = meta.get("amdhsa.kernels", [])
    if not isinstance(kernels, list):
        raise MetadataError("amdhsa.kernels is not a list")
    out: dict[str, list[KernelArg]] = {}
    for kernel in kernels:
        if not isinstance(kernel, dict) or not isinstance(kernel.get(".name"), str):
            raise MetadataError("a kernel's metadata has no .name")
        args = kernel.get(".args", [])
        if not isinstance(args, list):
            raise MetadataError(f"{kernel['.name']}: .args is not a list")
        layout = []
        for arg in args:
            if not isinstance(arg, dict):
                raise MetadataError(f"{kernel['.name']}: an argument is not a map")
            kind = arg.get(".value_kind")
            if not isinstance(kind, str):
                raise MetadataError(f"{kernel['.name']}: an argument has no .value_kind")
            if kind.startswith("hidden_"):
                continue
            layout.append(
                KernelArg(
                    offset=_int(arg.get(".offset"), ".offset"),
                    size=_int(arg.get(".size"), ".size"),
                    pointer=kind == "global_buffer",
                )
            )
        out[kernel[".name"]] = layout
        symbol = kernel.get(".symbol")
        if isinstance(symbol, str):
            out.setdefault(symbol.removesuffix(".kd"), layout)
    return out


class Layouts:
    """What a backend remembers to answer FUNCTION_PARAMS from code objects: each loaded
    module's kernel layouts, and which module and name each function came from. Keys are
    whatever the backend uses to tell modules and functions apart."""

    def __init__(self) -> None:
        self._modules: dict[object, dict[str, list[KernelArg]]] = {}
        self._functions: dict[object, tuple[object, str]] = {}

    def add_module(self, module: object, image: bytes) -> None:
        """Read ``image``'s layouts; an image that is not a valid AMD code object is
        remembered as having none (the runtime that loaded it is the judge of validity)."""
        try:
            self._modules[module] = kernel_layouts(image)
        except MetadataError:
            self._modules[module] = {}

    def add_function(self, function: object, module: object, name: str) -> None:
        """``function`` is ``module``'s kernel ``name``."""
        self._functions[function] = (module, name)

    def forget_module(self, module: object) -> None:
        """The module was unloaded: its functions go too."""
        self._modules.pop(module, None)
        for function in [f for f, (m, _) in self._functions.items() if m == module]:
            del self._functions[function]

    def params(self, function: object) -> list[tuple[int, int, bool]] | None:
        """``function``'s (offset, size, is-pointer) per explicit argument; None where the
        code object did not say."""
        where = self._functions.get(function)
        if where is None:
            return None
        layout = self._modules.get(where[0], {}).get(where[1])
        if layout is None:
            return None
        return [(a.offset, a.size, a.pointer) for a in layout]
