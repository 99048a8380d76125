"""Transport discovery: built-ins and third parties through one entry-point group."""

from __future__ import annotations

import functools
import importlib.metadata
from typing import Any, ClassVar

import anyio
import pytest
from anyio.abc import ByteStream, Listener
from anyio.streams.stapled import StapledByteStream

import hipr.transports as transports
from hipr.transports import (
    TransportConfig,
    TransportUrl,
    available_transports,
    connect,
    get_transport,
    listen,
)
from hipr.transports.base import Transport
from hipr.transports.ssh import SshTransport
from hipr.transports.tcp import TcpTransport
from hipr.transports.tls import TlsTransport
from hipr.transports.unix import UnixTransport


class LoopbackTransport:
    """A third-party transport: every connect gets a stream that echoes to itself."""

    scheme: ClassVar[str] = "loop"
    connects: ClassVar[list[TransportUrl]] = []

    async def listen(self, url: TransportUrl, config: TransportConfig) -> Listener[ByteStream]:
        raise ValueError("loop:// does not listen")

    async def connect(self, url: TransportUrl, **options: Any) -> ByteStream:
        self.connects.append(url)
        send, receive = anyio.create_memory_object_stream[bytes](16)
        return StapledByteStream(_SendBytes(send), _ReceiveBytes(receive))


class _SendBytes(anyio.abc.ByteSendStream):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def send(self, item: bytes) -> None:
        await self.inner.send(item)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _ReceiveBytes(anyio.abc.ByteReceiveStream):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return bytes(await self.inner.receive())

    async def aclose(self) -> None:
        await self.inner.aclose()


NOT_A_TRANSPORT = object()


def _with_entry_points(monkeypatch: pytest.MonkeyPatch, **extra: str) -> None:
    """Make importlib.metadata report third-party entry points besides the real ones."""
    real = importlib.metadata.entry_points
    # A fresh cache for this test only; monkeypatch puts the process-wide one back.
    monkeypatch.setattr(
        transports, "_entry_points", functools.cache(transports._entry_points.__wrapped__)
    )

    def fake(**kwargs: Any) -> Any:
        found: list[Any] = list(real(**kwargs))
        if kwargs.get("group") == transports.ENTRY_POINT_GROUP:
            found += [
                importlib.metadata.EntryPoint(name, value, transports.ENTRY_POINT_GROUP)
                for name, value in extra.items()
            ]
        return found

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)


def test_builtins_are_listed() -> None:
    table = available_transports()
    assert table["tcp"] == "hipr.transports.tcp:TcpTransport"
    assert table["unix"] == "hipr.transports.unix:UnixTransport"
    assert table["tls"] == "hipr.transports.tls:TlsTransport"
    assert table["ssh"] == "hipr.transports.ssh:SshTransport"


@pytest.mark.parametrize(
    ("scheme", "cls"),
    [("tcp", TcpTransport), ("unix", UnixTransport), ("TLS", TlsTransport), ("ssh", SshTransport)],
)
def test_builtins_resolve(scheme: str, cls: type) -> None:
    transport = get_transport(scheme)
    assert isinstance(transport, cls)
    assert isinstance(transport, Transport)
    assert transport.scheme == scheme.lower()
    assert get_transport(scheme) is transport  # one instance per scheme


def test_pyproject_declares_every_builtin() -> None:
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["entry-points"]["hipr.transports"]
    assert declared == transports._BUILTINS


def test_unknown_scheme_names_the_known_ones() -> None:
    with pytest.raises(
        ValueError, match=r"unknown transport scheme 'quic'; known schemes: "
    ) as info:
        get_transport("quic")
    for scheme in ("ssh", "tcp", "tls", "unix"):
        assert scheme in str(info.value)


@pytest.mark.anyio
async def test_third_party_transport_through_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_entry_points(monkeypatch, loop=f"{__name__}:LoopbackTransport")
    assert available_transports()["loop"] == f"{__name__}:LoopbackTransport"
    assert isinstance(get_transport("loop"), LoopbackTransport)
    with anyio.fail_after(5):
        stream = await connect("loop://anywhere/x?k=v")
        async with stream:
            await stream.send(b"ping")
            assert await stream.receive() == b"ping"
    assert LoopbackTransport.connects[-1].query == {"k": "v"}
    with pytest.raises(ValueError, match="does not listen"):
        await listen("loop://anywhere")
    # An unknown scheme now names the plugin too.
    with pytest.raises(ValueError, match="loop"):
        get_transport("nope")


def test_plugin_that_is_not_a_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_entry_points(monkeypatch, bad=f"{__name__}:NOT_A_TRANSPORT")
    with pytest.raises(ValueError, match="'bad' .* is not a transport"):
        get_transport("bad")


def test_plugin_that_fails_to_import(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_entry_points(monkeypatch, gone="hipr_no_such_module:Transport")
    with pytest.raises(ValueError, match="'gone' .* failed to load: No module named"):
        get_transport("gone")


@pytest.mark.anyio
async def test_unknown_option_is_named() -> None:
    with pytest.raises(ValueError, match=r"tcp:// does not take option\(s\) 'ca'"):
        await connect("tcp://127.0.0.1:1", ca="x.pem")


@pytest.mark.anyio
async def test_listen_many_needs_urls() -> None:
    with pytest.raises(ValueError, match="at least one URL"):
        await transports.listen_many([])
