"""Code objects named by content hash (MODULE_LOAD's ``sha256``, protocol 1.2): whether a
load offers the hash first, and the arguments that do."""

from __future__ import annotations

import hashlib
from typing import Any

from hipr.protocol.messages import ModuleLoad

#: The protocol minor version whose workers take MODULE_LOAD by ``sha256``.
HASH_LOADS_SINCE_MINOR = 2
#: Code objects smaller than this are sent as they are: their hash and a second round
#: trip would cost more than the bytes.
HASH_OFFER_MIN_BYTES = 4096


def hash_offer(image: Any, protocol: object) -> dict[str, bytes] | None:
    """MODULE_LOAD's arguments naming ``image`` by its SHA-256, when the worker (its HELLO
    ``protocol``) takes them and the image is large enough to be worth it; else None."""
    if not isinstance(protocol, int) or protocol & 0xFF < HASH_LOADS_SINCE_MINOR:
        return None
    view = memoryview(image).cast("B")
    if view.nbytes < HASH_OFFER_MIN_BYTES:
        return None
    return {ModuleLoad.sha256: hashlib.sha256(view).digest()}
