"""Request handlers, one module per opcode range; importing this package registers them."""

from hipr.handlers import (  # noqa: F401  (imported for their registrations)
    admin,
    device,
    device_limits,
    event,
    function_attrs,
    graph,
    memory,
    module,
    module_globals,
    program_link,
    session_ops,
    stream,
)
from hipr.handlers.registry import REGISTRY, HandlerRegistry, RegistrationError, handler

__all__ = ["REGISTRY", "HandlerRegistry", "RegistrationError", "handler"]
