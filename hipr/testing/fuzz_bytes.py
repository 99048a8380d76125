"""Byte-level damage for fuzzing the worker: encoded frames with bits flipped, bytes cut,
inserted or repeated, header fields and the CBOR length prefix overwritten, and frames of
random bytes behind a valid magic. Sans-I/O, replayed from the seed of its
:class:`random.Random`; the structured generators are in :mod:`hipr.testing.fuzz`."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

from hipr.protocol.codec import ARGS_LENGTH
from hipr.protocol.header import HEADER, HEADER_SIZE, MAGIC, PROTOCOL_VERSION
from hipr.testing.fuzz import NASTY_CBOR


class RawMutator:
    """Damages encoded frames at the byte level. Each call applies one mutation."""

    def __init__(self, rng: random.Random, max_payload: int) -> None:
        self.rng = rng
        self.max_payload = max_payload
        self._mutations: tuple[Callable[[bytearray], bytearray], ...] = (
            self.flip_bits,
            self.flip_bits,
            self.set_bytes,
            self.truncate,
            self.insert,
            self.delete,
            self.duplicate,
            self.header_length,
            self.header_length,
            self.header_field,
            self.header_field,
            self.args_length,
            self.replace_cbor,
            self.garbage,
        )

    def mutate(self, data: bytes, rounds: int = 1) -> bytes:
        """``data`` after ``rounds`` random mutations."""
        buffer = bytearray(data)
        for _ in range(rounds):
            buffer = self.rng.choice(self._mutations)(buffer)
        return bytes(buffer)

    def flip_bits(self, b: bytearray) -> bytearray:
        """Flip 1 to 8 random bits."""
        for _ in range(self.rng.randrange(1, 9)):
            if b:
                b[self.rng.randrange(len(b))] ^= 1 << self.rng.randrange(8)
        return b

    def set_bytes(self, b: bytearray) -> bytearray:
        """Overwrite a few bytes with boundary values."""
        for _ in range(self.rng.randrange(1, 5)):
            if b:
                b[self.rng.randrange(len(b))] = self.rng.choice((0x00, 0xFF, 0x7F, 0x80, 0x01))
        return b

    def truncate(self, b: bytearray) -> bytearray:
        """Cut the data short (mid-header, mid-CBOR, mid-bulk)."""
        return b[: self.rng.randrange(len(b) + 1)]

    def insert(self, b: bytearray) -> bytearray:
        """Insert random bytes anywhere."""
        at = self.rng.randrange(len(b) + 1)
        return b[:at] + self.rng.randbytes(self.rng.choice((1, 2, 4, 24, 100))) + b[at:]

    def delete(self, b: bytearray) -> bytearray:
        """Remove a random range."""
        if not b:
            return b
        at = self.rng.randrange(len(b))
        return b[:at] + b[at + self.rng.randrange(1, 25) :]

    def duplicate(self, b: bytearray) -> bytearray:
        """Repeat a range (a frame sent twice, a header repeated)."""
        if not b:
            return b
        at = self.rng.randrange(len(b))
        end = min(len(b), at + self.rng.randrange(1, 64))
        return b[:end] + b[at:end] + b[end:]

    def header_length(self, b: bytearray) -> bytearray:
        """Set the payload length field of the header: up to 2**64-1, or just off."""
        if len(b) < HEADER_SIZE:
            return self.garbage(b)
        actual = len(b) - HEADER_SIZE
        length = self.rng.choice(
            (
                0,
                1,
                3,
                4,
                actual - 1 if actual else 0,
                actual + 1,
                actual + 4096,
                self.max_payload,
                self.max_payload + 1,
                2**32 - 1,
                2**32,
                2**63,
                2**64 - 1,
                self.rng.randrange(2**64),
            )
        )
        struct.pack_into("<Q", b, 16, length)
        return b

    def header_field(self, b: bytearray) -> bytearray:
        """Overwrite the magic, version, opcode, request id or flags."""
        if len(b) < HEADER_SIZE:
            return self.garbage(b)
        which = self.rng.randrange(5)
        if which == 0:
            b[0:4] = self.rng.choice((b"HIPX", b"hipr", b"\0\0\0\0", self.rng.randbytes(4)))
        elif which == 1:
            struct.pack_into("<H", b, 4, self.rng.choice((0, 0x0101, 0x0200, 0xFFFF)))
        elif which == 2:
            struct.pack_into("<H", b, 6, self.rng.randrange(0x10000))
        elif which == 3:
            struct.pack_into("<I", b, 8, self.rng.choice((0, 2**32 - 1)))
        else:
            struct.pack_into("<I", b, 12, self.rng.randrange(2**32))
        return b

    def args_length(self, b: bytearray) -> bytearray:
        """Overwrite the u32 CBOR length prefix (past the payload, zero, off by one)."""
        if len(b) < HEADER_SIZE + 4:
            return self.garbage(b)
        current = struct.unpack_from("<I", b, HEADER_SIZE)[0]
        struct.pack_into(
            "<I",
            b,
            HEADER_SIZE,
            self.rng.choice(
                (0, min(current + 1, 2**32 - 1), max(current - 1, 0), 2**31, 2**32 - 1)
            ),
        )
        return b

    def replace_cbor(self, b: bytearray) -> bytearray:
        """Swap the CBOR part for a hostile one, lengths kept consistent."""
        if len(b) < HEADER_SIZE:
            return self.garbage(b)
        cbor_part = self.rng.choice(NASTY_CBOR)
        payload = ARGS_LENGTH.pack(len(cbor_part)) + cbor_part
        struct.pack_into("<Q", b, 16, len(payload))
        return b[:HEADER_SIZE] + payload

    def garbage(self, b: bytearray) -> bytearray:
        """Random bytes, sometimes behind a valid magic."""
        junk = bytearray(self.rng.randbytes(self.rng.choice((1, 7, 23, 24, 25, 64, 300))))
        if self.rng.random() < 0.5:
            junk[:4] = MAGIC[: len(junk)]
        return junk


def random_frames(rng: random.Random, count: int) -> bytes:
    """Headers with a valid magic and random everything else, with random payloads."""
    out = bytearray()
    for _ in range(count):
        payload = rng.randbytes(rng.choice((0, 1, 4, 5, 16, 200)))
        out += HEADER.pack(
            MAGIC,
            rng.choice((PROTOCOL_VERSION, rng.randrange(0x10000))),
            rng.randrange(0x10000),
            rng.randrange(2**32),
            rng.randrange(2**32),
            len(payload),
        )
        out += payload
    return bytes(out)
