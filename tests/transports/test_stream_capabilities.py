"""A stream's optional capabilities (push delivery, writes from other threads) are found
through ``TransportAttribute``, and only on the stream that offers them itself."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import anyio
import pytest
from anyio.abc import ByteStream, SocketAttribute

from hipr.transports import TransportAttribute, connect, listen
from hipr.transports.base import stream_capability


class _Offering(ByteStream):
    """A stream offering both capabilities, as the plain socket streams do."""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        raise anyio.EndOfStream

    async def send(self, item: bytes) -> None:
        pass

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return {
            TransportAttribute.push_delivery: lambda: self,
            TransportAttribute.thread_writer: lambda: self,
        }


class _Wrapping(_Offering):
    """A stream over another that forwards its attributes, as anyio's TLS stream does."""

    def __init__(self, inner: ByteStream) -> None:
        self.inner = inner

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return dict(self.inner.extra_attributes)


@pytest.mark.parametrize(
    "attribute", [TransportAttribute.push_delivery, TransportAttribute.thread_writer]
)
def test_a_stream_offers_its_own_capability(attribute: Any) -> None:
    stream = _Offering()
    assert stream_capability(stream, attribute) is stream


@pytest.mark.parametrize(
    "attribute", [TransportAttribute.push_delivery, TransportAttribute.thread_writer]
)
def test_a_wrapper_does_not_pass_on_the_capability_of_the_stream_it_wraps(
    attribute: Any,
) -> None:
    inner = _Offering()
    wrapper = _Wrapping(inner)
    assert wrapper.extra(attribute) is inner  # anyio forwards it...
    assert stream_capability(wrapper, attribute) is None  # ...but bytes would skip the wrapper


@pytest.mark.anyio
async def test_an_accepted_tcp_stream_offers_push_delivery_only_under_asyncio(
    anyio_backend: str,
) -> None:
    """asyncio serves a plain socket with the loop's transport (push delivery and thread
    writes); trio with a non-blocking socket (thread writes only)."""
    with anyio.fail_after(10):
        listener = await listen("tcp://127.0.0.1:0")
        port = listener.extra(SocketAttribute.local_port)
        seen: list[tuple[bool, bool]] = []
        accepted = anyio.Event()

        async def handler(stream: ByteStream) -> None:
            push: object = stream_capability(stream, TransportAttribute.push_delivery)
            writer: object = stream_capability(stream, TransportAttribute.thread_writer)
            seen.append((push is stream, writer is stream))
            accepted.set()
            await stream.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, handler)
            async with await connect(f"tcp://127.0.0.1:{port}"):
                await accepted.wait()
            tg.cancel_scope.cancel()
        await listener.aclose()
    on_asyncio = anyio_backend.startswith("asyncio")
    assert seen == [(on_asyncio, True)]
