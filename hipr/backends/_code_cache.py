"""The GPU backend's compile cache: code objects by what compiled them."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence


class CodeCache:
    """Compiled code objects by sha256 of (source, effective options, arch): a session
    that compiles the same kernel again, or another tenant's identical one, gets it
    without running the compiler. Bounded, least recently used out first."""

    def __init__(self, max_entries: int = 256) -> None:
        self._max = max_entries
        self._lock = threading.Lock()
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(source: str, options: Sequence[str], arch: str) -> str:
        """The cache key; NUL separators keep ("ab","c") and ("a","bc") apart."""
        h = hashlib.sha256()
        h.update(source.encode())
        for opt in options:
            h.update(b"\0o")
            h.update(opt.encode())
        h.update(b"\0a")
        h.update(arch.encode())
        return h.hexdigest()

    def get(self, key: str) -> bytes | None:
        """The cached image, or None."""
        with self._lock:
            image = self._items.get(key)
            if image is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return image

    def put(self, key: str, image: bytes) -> None:
        """Remember an image."""
        with self._lock:
            self._items[key] = image
            self._items.move_to_end(key)
            while len(self._items) > self._max:
                self._items.popitem(last=False)
