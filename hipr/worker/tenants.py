"""Tenants: who may use the worker, with which credentials, within which quotas.

The tenants file holds token *hashes* only (SHA-256, hex): a leaked file grants nothing.
Tokens are compared by hash in constant time. Every quota is optional; a tenant with
none set is bounded only by the worker's own limits, and by the default
``max_request_rate`` (``hipr.sessions.limits.DEFAULT_MAX_REQUEST_RATE``, far above any
client's pace: ``inf`` lifts it). ``weight`` is the tenant's share of the worker's event
loop against other tenants while several flood it (``hipr.worker.fairness``).

```toml
[tenants.alice]
tokens = ["<sha256 hex of a token>"]       # `hipr token new alice` prints one
revoked_tokens = []                         # hashes that get "revoked", not "wrong"
unix_uids = [1000]                          # unix:// peers with this uid need no token
cert_subjects = ["alice"]                   # mutual-TLS client certificate CN
max_sessions = 4
max_device_memory = "8GiB"
max_streams = 64
max_events = 256
max_modules = 32
max_graphs = 32
max_request_rate = 2000                     # requests per second, token bucket ...
max_request_burst = 4000                    # ... with this burst (default: 2 s worth)
                                            # (default rate 1000000; inf: unlimited)
max_inflight_bytes = "256MiB"               # each frame counts for at least 1 KiB
max_frame_bytes = "64MiB"
max_kernel_seconds = 600                    # GPU work running longer is stopped
weight = 1.0                                # share of the loop while tenants contend
module_store_bytes = "1GiB"                 # code objects kept to load by hash (0: none)
module_store_count = 4096                   # ... and how many of them
```
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hipr.errors import AuthError

# Quotas are named here too: a tenant's table sets them (``Tenant.quotas``).
from hipr.sessions.limits import ANONYMOUS
from hipr.sessions.limits import Quotas as Quotas
from hipr.worker.config import ConfigError, parse_size

#: Largest ``weight``: a slice 100 times the default (100 ms of loop) already makes the
#: other tenants wait that long for a turn.
MAX_WEIGHT = 100.0
TOKEN_PREFIX = "hipr_"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def new_token() -> str:
    """A fresh random token: 256 bits, URL-safe."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """The SHA-256 (hex) that the tenants file stores for ``token``."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


_SIZE_QUOTAS = {
    "max_device_memory",
    "max_inflight_bytes",
    "max_frame_bytes",
    "module_store_bytes",
}
#: Quotas that may be 0: a module store of no bytes or no images keeps nothing.
_ZERO_OK = {"module_store_bytes", "module_store_count"}
_FLOAT_QUOTAS = {"max_request_rate", "max_request_burst", "max_kernel_seconds", "weight"}
#: Quotas that may be ``inf`` (TOML's infinity): no limit.
_INFINITE_OK = {"max_request_rate", "max_request_burst"}
_QUOTA_KEYS = {f.name for f in fields(Quotas)}


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant: its credentials and quotas."""

    name: str
    quotas: Quotas = field(default_factory=Quotas)
    token_hashes: tuple[str, ...] = ()
    revoked_hashes: tuple[str, ...] = ()
    unix_uids: tuple[int, ...] = ()
    cert_subjects: tuple[str, ...] = ()


def _digest_in(digest: bytes, hashes: tuple[str, ...]) -> bool:
    # Compare against every entry (no early exit), each in constant time.
    found = False
    for stored in hashes:
        found |= hmac.compare_digest(digest, bytes.fromhex(stored))
    return found


@dataclass(frozen=True, slots=True)
class TenantRegistry:
    """All tenants of a worker; ``anonymous`` when the worker has no tenants file."""

    tenants: Mapping[str, Tenant]
    anonymous: bool

    @staticmethod
    def open_worker() -> TenantRegistry:
        """One anonymous tenant without quotas: no tenants file configured."""
        return TenantRegistry({ANONYMOUS: Tenant(ANONYMOUS)}, anonymous=True)

    def authenticate(
        self, token: str | None, *, unix_uid: int | None = None, cert_subject: str | None = None
    ) -> Tenant:
        """The tenant that these credentials name, or AuthError saying what was wrong
        (never echoing the token)."""
        if self.anonymous:
            return self.tenants[ANONYMOUS]
        if token:
            digest = hashlib.sha256(token.encode("utf-8")).digest()
            match: Tenant | None = None
            revoked = False
            for tenant in self.tenants.values():
                if _digest_in(digest, tenant.token_hashes):
                    match = tenant
                revoked |= _digest_in(digest, tenant.revoked_hashes)
            if revoked:
                raise AuthError(message="the token was revoked; ask the operator for a new one")
            if match is not None:
                return match
            raise AuthError(message="the token is not valid for this worker")
        for tenant in self.tenants.values():
            if unix_uid is not None and unix_uid in tenant.unix_uids:
                return tenant
            if cert_subject is not None and cert_subject in tenant.cert_subjects:
                return tenant
        raise AuthError(
            message="this worker requires a token: pass token=... to hipr.connect "
            "or set HIPR_TOKEN",
            missing=True,
        )

    def get(self, name: str) -> Tenant | None:
        """The tenant called ``name`` (after a reload it may be gone)."""
        return self.tenants.get(name)


def _fail(path: Path, key: str, message: str) -> ConfigError:
    return ConfigError(f"{path}: {key}: {message}")


def _hashes(path: Path, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, key, "expected a list of SHA-256 hex strings")
    for v in value:
        if not _SHA256.match(v):
            raise _fail(
                path,
                key,
                "expected 64 lowercase hex digits (the SHA-256 of a token, as `hipr token new` "
                "prints it); never put a token itself in this file",
            )
    return tuple(value)


def _quota(path: Path, key: str, name: str, value: Any) -> int | float:
    try:
        if name in _SIZE_QUOTAS:
            number: int | float = parse_size(value)
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {value!r}")
        else:
            number = value if name in _FLOAT_QUOTAS else int(value)
            if name not in _FLOAT_QUOTAS and number != value:
                raise ValueError(f"expected a whole number, got {value!r}")
    except ValueError as exc:
        raise _fail(path, key, str(exc)) from None
    if number != number or number < 0 or (number == 0 and name not in _ZERO_OK):
        raise _fail(path, key, f"must be positive, got {value!r}")
    if number == float("inf") and name not in _INFINITE_OK:
        raise _fail(path, key, f"must be finite, got {value!r}")
    if name == "weight" and number > MAX_WEIGHT:
        raise _fail(
            path, key, f"at most {MAX_WEIGHT:g} (a slice that long is a stall), got {value!r}"
        )
    return number


def parse_tenants(data: Mapping[str, Any], path: Path) -> TenantRegistry:
    """Build the registry from a parsed tenants file."""
    unknown = set(data) - {"tenants"}
    if unknown:
        raise _fail(path, sorted(unknown)[0], "unknown key (the file holds [tenants.NAME] tables)")
    tables = data.get("tenants", {})
    if not isinstance(tables, dict) or not tables:
        raise _fail(path, "tenants", "expected at least one [tenants.NAME] table")
    tenants: dict[str, Tenant] = {}
    seen_hashes: dict[str, str] = {}
    for name, table in tables.items():
        prefix = f"tenants.{name}"
        if not _NAME.match(name):
            raise _fail(path, prefix, "tenant names are 1-64 letters, digits, '_', '.' or '-'")
        if not isinstance(table, dict):
            raise _fail(path, prefix, "expected a table")
        quotas: dict[str, Any] = {}
        tokens: tuple[str, ...] = ()
        revoked: tuple[str, ...] = ()
        uids: tuple[int, ...] = ()
        subjects: tuple[str, ...] = ()
        for key, value in table.items():
            dotted = f"{prefix}.{key}"
            if key == "tokens":
                tokens = _hashes(path, dotted, value)
            elif key == "revoked_tokens":
                revoked = _hashes(path, dotted, value)
            elif key == "unix_uids":
                if not isinstance(value, list) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
                ):
                    raise _fail(path, dotted, "expected a list of non-negative uids")
                uids = tuple(value)
            elif key == "cert_subjects":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise _fail(path, dotted, "expected a list of certificate common names")
                subjects = tuple(value)
            elif key in _QUOTA_KEYS:
                quotas[key] = _quota(path, dotted, key, value)
            else:
                known = ", ".join(
                    sorted(_QUOTA_KEYS | {"tokens", "revoked_tokens", "unix_uids", "cert_subjects"})
                )
                raise _fail(path, dotted, f"unknown key (known: {known})")
        for digest in tokens:
            if digest in seen_hashes:
                raise _fail(
                    path, f"{prefix}.tokens", f"a token hash also belongs to {seen_hashes[digest]}"
                )
            seen_hashes[digest] = name
        tenants[name] = Tenant(name, Quotas(**quotas), tokens, revoked, uids, subjects)
    return TenantRegistry(tenants, anonymous=False)


def load_tenants(path: Path | None) -> TenantRegistry:
    """The tenants of ``path``; the anonymous registry when ``path`` is None."""
    if path is None:
        return TenantRegistry.open_worker()
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"{path}: tenants file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_tenants(data, path)
