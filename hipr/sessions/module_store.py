"""A tenant's module store: the code objects its sessions loaded by content hash
(MODULE_LOAD's ``sha256``, protocol 1.2), kept so that a later session of the same tenant
names one by its hash and its bytes do not cross the wire again.

It keeps image bytes, never loaded modules: each session still loads its own module in
its own context, so unloading and isolation are as without it. One store per tenant,
never shared across tenants (a tenant offering another's hash is told "not held"); it is
bounded by bytes and count (the tenant's ``module_store_bytes`` and
``module_store_count``), least recently used out first. The key is the SHA-256 the
worker computed itself from the bytes it received, never the client's word alone.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import astuple, dataclass, fields

#: Bytes of a SHA-256 digest.
DIGEST_BYTES = 32


def sha256(image: bytes | memoryview) -> bytes:
    """The SHA-256 digest of ``image``."""
    return hashlib.sha256(image).digest()


@dataclass(frozen=True, slots=True)
class StoreFigures:
    """A store's counters and holdings, for the metrics and status."""

    hits: int
    misses: int
    bytes_saved: int
    bytes_received: int
    evictions: int
    held_bytes: int
    held_images: int

    def __add__(self, other: StoreFigures) -> StoreFigures:
        return StoreFigures(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    @classmethod
    def from_wire(cls, row: object) -> StoreFigures | None:
        """Figures a child worker sent as a map of its fields (:func:`dataclasses.asdict`);
        None when ``row`` is not such a map of non-negative integers."""
        if not isinstance(row, dict) or set(row) != {f.name for f in fields(cls)}:
            return None
        values = [row[f.name] for f in fields(cls)]
        if not all(type(v) is int and v >= 0 for v in values):
            return None
        return cls(*values)


class ModuleStore:
    """The code objects one tenant's sessions loaded by hash, least recently used first.

    Not thread-safe: a worker's handlers run on its event loop (a tenant child worker
    has a store of its own for its one tenant)."""

    def __init__(self) -> None:
        self._images: OrderedDict[bytes, bytes] = OrderedDict()
        self._held_bytes = 0
        self.hits = 0
        self.misses = 0
        self.bytes_saved = 0
        self.bytes_received = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._images)

    def __contains__(self, digest: object) -> bool:
        return digest in self._images

    @property
    def held_bytes(self) -> int:
        """Bytes of the images held now."""
        return self._held_bytes

    def lookup(self, digest: bytes) -> bytes | None:
        """The image whose SHA-256 is ``digest`` (now the most recently used), counted as
        a hit with its bytes saved; None, counted as a miss, when not held."""
        image = self._images.get(digest)
        if image is None:
            self.misses += 1
            return None
        self._images.move_to_end(digest)
        self.hits += 1
        self.bytes_saved += len(image)
        return image

    def add(self, digest: bytes, image: bytes, *, max_bytes: int, max_images: int) -> None:
        """Keep ``image`` under ``digest``, which the caller computed from ``image`` itself
        (:func:`sha256`; a client's claim is only compared with it), evicting the least
        recently used images until both bounds hold. An image larger than ``max_bytes``
        (or a store bounded to no images) is not kept."""
        if digest in self._images:
            self._images.move_to_end(digest)
            return
        size = len(image)
        if size > max_bytes or max_images < 1:
            return
        self.trim(max_bytes=max_bytes - size, max_images=max_images - 1)
        self._images[digest] = image
        self._held_bytes += size

    def received(self, size: int) -> None:
        """Count a code object's bytes that came over the wire (with a hash or without):
        what the store saves is measured against it."""
        self.bytes_received += size

    def trim(self, *, max_bytes: int, max_images: int) -> None:
        """Evict least recently used images until both bounds hold (the tenant's bounds
        were lowered by a reload)."""
        while self._images and (self._held_bytes > max_bytes or len(self._images) > max_images):
            _, old = self._images.popitem(last=False)
            self._held_bytes -= len(old)
            self.evictions += 1

    def figures(self) -> StoreFigures:
        """The counters and holdings now."""
        return StoreFigures(
            self.hits,
            self.misses,
            self.bytes_saved,
            self.bytes_received,
            self.evictions,
            self._held_bytes,
            len(self._images),
        )
