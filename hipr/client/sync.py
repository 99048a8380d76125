"""The synchronous client: the async API's own code, run in the caller's thread.

``hipr.connect(url)`` returns an object with exactly the async API's names. Its calls
run the same coroutines as :class:`~hipr.client.api.AsyncGpu`, but over a
:class:`~hipr.client.blocking.BlockingConnection` whose requests block on the socket
and never suspend: each coroutine runs to completion in one ``send(None)``, with no
event loop and no thread hop. The API is written once and the two clients cannot drift.

Handles come back wrapped the same way, so ``s.synchronize()`` works on a stream from
``gpu.stream_create()``. A third-party transport with no blocking connect falls back to
the async client on a private event-loop thread (one hop per call, as before).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from hipr._version import __version__
from hipr.client.api import DEFAULT_URL, AsyncGpu, aconnect, check_hello, hello_args
from hipr.client.blocking import BlockingConnection
from hipr.client.direct import declared_send
from hipr.client.link import EventCallback, LinkOptions
from hipr.client.objects import _Handle
from hipr.protocol.codec import DEFAULT_MAX_PAYLOAD

#: The event loop behind the fallback for transports without a blocking connect.
SYNC_LOOP = "asyncio"

Runner = Callable[[Callable[..., Coroutine[Any, Any, Any]], tuple[Any, ...], dict[str, Any]], Any]


def run_inline(
    fn: Callable[..., Coroutine[Any, Any, Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Run an API coroutine on a blocking connection: it never suspends, so one
    ``send`` runs it to the end."""
    coro = fn(*args, **kwargs)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError(f"{getattr(fn, '__qualname__', fn)} suspended on a blocking connection")


#: Argument types that are never proxies nor hold one: passed through at once.
_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})


def _unwrap(value: Any) -> Any:
    if type(value) in _PLAIN:
        return value
    if isinstance(value, SyncProxy):
        return value._target
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_unwrap(v) for v in value)
    return value


def _direct(
    call: Callable[..., Any],
    request: Callable[..., tuple[Any, ...]],
    send: Callable[..., None],
) -> Callable[..., Any]:
    """``call``, an API method declared with :func:`~hipr.client.direct.sends`, as a
    direct send on the blocking connection: ``request`` (the method's own request
    builder, which the async method sends too) gives what ``send`` takes, with no
    coroutine to run. A ``timeout=`` goes the general way. Arguments are not unwrapped:
    a request builder reads handles only through ``handle_id``, which a proxy answers as
    its handle does."""

    @functools.wraps(call)
    def fast(*args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        if timeout is None:
            send(*request(*args, **kwargs))
            return None
        return call(*args, timeout=timeout, **kwargs)

    return fast


class SyncProxy:
    """Wraps an async API object; its coroutine methods become blocking calls.

    Each class of wrapped object has a sync class of its own (:func:`sync_class`), with
    a real method per public method of the async class, carrying its name, signature and
    docstring, so ``dir()``, ``help()`` and the API reference show them. On first use a
    method makes the instance's blocking version (a direct send for the methods that
    declare one, :mod:`hipr.client.direct`) and keeps it on the instance, so later calls
    find it as a plain attribute."""

    def __init__(self, target: Any, runner: Runner) -> None:
        self._target = target
        self._runner = runner

    def _bind(self, name: str) -> Any:
        """The blocking version of the target's coroutine method ``name``, kept on the
        instance; a plain attribute of the target as it is."""
        attr = getattr(self._target, name)
        if not inspect.iscoroutinefunction(attr):
            return attr
        runner = self._runner

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            if args:
                args = tuple([_unwrap(a) for a in args])
            if kwargs:
                kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
            return wrap(runner(attr, args, kwargs), runner)

        method: Callable[..., Any] = call
        declared = declared_send(attr) if runner is run_inline else None
        if declared is not None:
            how, builder = declared
            send = getattr(self._target._link(), how.value)
            method = _direct(call, builder.__get__(self._target), send)
        self.__dict__[name] = method
        return method

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._bind(name)

    def __dir__(self) -> list[str]:
        public = (n for n in dir(self._target) if not n.startswith("_"))
        return sorted(set(super().__dir__()) | set(public))

    def __repr__(self) -> str:
        return repr(self._target)

    def __eq__(self, other: object) -> bool:
        return bool(_unwrap(other) == self._target)

    def __hash__(self) -> int:
        return hash(self._target)


def _sync_method(name: str, coroutine_function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(coroutine_function)
    def method(self: SyncProxy, *args: Any, **kwargs: Any) -> Any:
        # A caller may hold this class method (``post = gpu.memcpy_htod_async``) from
        # before the instance's blocking version existed: it then finds that version,
        # made once, rather than making one per call.
        bound = self.__dict__.get(name)
        if bound is None:
            bound = self._bind(name)
        return bound(*args, **kwargs)

    method.__doc__ = (inspect.getdoc(coroutine_function) or "") + (
        "\n\nBlocking: the coroutine of the async API, run in the caller's thread."
    )
    return method


def _delegate(name: str, member: Any) -> Any:
    """A public property or plain method of the async class, read through the proxy."""
    if isinstance(member, property):
        return property(lambda self: getattr(self._target, name), doc=member.__doc__)

    @functools.wraps(member)
    def method(self: SyncProxy, *args: Any, **kwargs: Any) -> Any:
        if args:
            args = tuple([_unwrap(a) for a in args])
        return getattr(self._target, name)(*args, **kwargs)

    del method.__wrapped__  # type: ignore[attr-defined]
    return method


def add_sync_methods(cls: type[SyncProxy], async_cls: type) -> None:
    """Give ``cls`` a blocking method for each public coroutine method of ``async_cls``
    that ``cls`` does not define itself, and the async class's public properties and
    plain methods, read through the proxy (so that ``dir()`` and the reference show
    the same names on both)."""
    for name, member in inspect.getmembers(async_cls):
        if name.startswith("_") or name in cls.__dict__ or hasattr(SyncProxy, name):
            continue
        if isinstance(member, property) or (
            inspect.isfunction(member) and not inspect.iscoroutinefunction(member)
        ):
            setattr(cls, name, _delegate(name, member))
    for name, fn in inspect.getmembers(async_cls, inspect.iscoroutinefunction):
        if not name.startswith("_") and name not in cls.__dict__:
            method = _sync_method(name, fn)
            # Its own class's method (for help(), pickling's names and the reference),
            # not the async one's, whose name functools.wraps copied.
            method.__module__ = cls.__module__
            method.__qualname__ = f"{cls.__qualname__}.{name}"
            method.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
            del method.__wrapped__  # type: ignore[attr-defined]  # else tools take it for the async one
            setattr(cls, name, method)


_SYNC_CLASSES: dict[type, type[SyncProxy]] = {}


def register_sync_class(async_cls: type, cls: type[SyncProxy]) -> None:
    """Results of type ``async_cls`` come back to sync code wrapped in ``cls`` (a class
    written by hand, such as the multi-worker client's handles)."""
    _SYNC_CLASSES[async_cls] = cls


def wrap(result: Any, runner: Runner) -> Any:
    """A result of an API coroutine as sync code gets it: a handle (or any object of a
    registered async class) in its sync class, anything else as it is."""
    cls = _SYNC_CLASSES.get(type(result))
    if cls is None:
        if not isinstance(result, _Handle):
            return result
        cls = sync_class(type(result))
    return cls(result, runner)


def inline_view(obj: Any) -> Any:
    """The async API object to drive with :func:`run_inline` for ``obj``: a sync client
    object's own async target where its coroutines run inline (a blocking connection),
    an object whose coroutines never suspend where it runs on a portal thread (a
    transport without a blocking connect), an async object as it is."""
    if not isinstance(obj, SyncProxy):
        return obj
    if obj._runner is run_inline:
        return obj._target
    return _NoSuspend(obj)


class _NoSuspend:
    """A sync client object seen as an async one whose coroutines never suspend: each
    runs the sync call (on its portal thread) and returns. Handles it returns are seen
    the same way, and arguments of this kind are handed back as the sync objects."""

    __slots__ = ("_sync",)

    def __init__(self, sync: SyncProxy) -> None:
        self._sync = sync

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._sync, name)
        if name.startswith("_") or not inspect.iscoroutinefunction(
            getattr(self._sync._target, name, None)
        ):
            return attr  # not a coroutine of the async API: the same on both sides

        async def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(a._sync if isinstance(a, _NoSuspend) else a for a in args)
            kwargs = {k: v._sync if isinstance(v, _NoSuspend) else v for k, v in kwargs.items()}
            result = attr(*args, **kwargs)
            return _NoSuspend(result) if isinstance(result, SyncProxy) else result

        call.__name__ = name
        call.__doc__ = attr.__doc__
        return call

    def __eq__(self, other: object) -> bool:
        mine = other._sync if isinstance(other, _NoSuspend) else other
        return bool(self._sync == mine)

    def __hash__(self) -> int:
        return hash(self._sync)

    def __repr__(self) -> str:
        return repr(self._sync)


def run_sync(fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any, **kwargs: Any) -> Any:
    """Run an async API function (placement's, say) for sync client objects: each
    argument is seen through :func:`inline_view`, and the coroutine runs inline."""
    return run_inline(fn, tuple(inline_view(a) for a in args), kwargs)


def sync_class(async_cls: type) -> type[SyncProxy]:
    """The sync class for objects of ``async_cls`` (``Stream`` -> ``SyncStream``), made
    once: the async class's docstring and its methods, blocking."""
    cls = _SYNC_CLASSES.get(async_cls)
    if cls is None:
        doc = (async_cls.__doc__ or "").rstrip() + (
            f"\n\nThe synchronous client's {async_cls.__name__}: the methods of "
            f":class:`hipr.{async_cls.__name__}`, blocking."
        )
        cls = type(
            f"Sync{async_cls.__name__}",
            (SyncProxy,),
            {"__doc__": doc, "__module__": __name__, "__slots__": ()},
        )
        add_sync_methods(cls, async_cls)
        _SYNC_CLASSES[async_cls] = cls
    return cls


class Gpu(SyncProxy):
    """A remote device for synchronous code; use as a context manager or ``close()``.

    Thread-safe: several threads may share one ``Gpu``; each call still costs one
    round trip on the caller's thread."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        on_event: EventCallback | None = None,
        link: LinkOptions | None = None,
        **transport_options: Any,
    ) -> None:
        from hipr.transports import connect_blocking

        self._connection: BlockingConnection | None = None
        self._stack = contextlib.ExitStack()
        options = link or LinkOptions(connect_timeout=timeout)

        def connector(seconds: float) -> Any:
            return connect_blocking(url, connect_timeout=seconds, **transport_options)

        connection = BlockingConnection(url, connector, DEFAULT_MAX_PAYLOAD, options, on_event)
        try:
            hello = connection.open(hello_args(token, __version__))
        except NotImplementedError:  # a transport plugin without a blocking connect
            self._open_on_portal(url, token, timeout, on_event, link, transport_options)
            return
        try:
            check_hello(hello, url)
        except BaseException:
            connection.close()
            raise
        self._connection = connection
        super().__init__(AsyncGpu(connection, hello), run_inline)

    def _open_on_portal(
        self,
        url: str,
        token: str | None,
        timeout: float,
        on_event: EventCallback | None,
        link: LinkOptions | None,
        transport_options: dict[str, Any],
    ) -> None:
        try:
            portal: BlockingPortal = self._stack.enter_context(start_blocking_portal(SYNC_LOOP))
            gpu: AsyncGpu = self._stack.enter_context(
                portal.wrap_async_context_manager(
                    aconnect(
                        url,
                        token=token,
                        timeout=timeout,
                        on_event=on_event,
                        link=link,
                        **transport_options,
                    )
                )
            )
        except BaseException:
            self._stack.close()
            raise

        def on_portal(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return portal.call(functools.partial(fn, *args, **kwargs))

        super().__init__(gpu, on_portal)

    def close(self) -> None:
        """End the session (the worker frees everything it holds) and close the link."""
        if self._connection is not None:
            self._connection.goodbye()
        self._stack.close()

    def __enter__(self) -> Gpu:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


add_sync_methods(Gpu, AsyncGpu)


def connect(url: str = DEFAULT_URL, **options: Any) -> Gpu:
    """Connect to a worker from synchronous code: ``with hipr.connect(url) as gpu: ...``.

    Takes the same options as :func:`hipr.aconnect` (``token=``, ``timeout=``,
    ``on_event=``, ``link=``, transport options).
    """
    return Gpu(url, **options)
