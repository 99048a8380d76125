"""How a message is declared: its fields, their wire types, and what the call is.

A request is declared once, as a class whose attributes are its fields::

    @message(Opcode.MALLOC, reply=(Out("ptr", "address", "the allocation's start"),))
    class Malloc(Message):
        \"\"\"Allocate on the session's current device.\"\"\"

        size = field("size", "bytes to allocate")

After :func:`message` has run, ``Malloc.size`` is the plain string ``"size"``: the key
that the client puts in the CBOR map and the handler reads, spelled once, here. The
declarations are data (``Malloc.fields``, ``Malloc.reply``) for the generated
``docs/protocol.md`` and for the tests that hold handlers and clients to them. Nothing
here runs per call: a request is a plain dict, built and read with these keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast

from hipr.protocol.opcodes import Opcode

#: The wire types a field may have: name -> what it is in CBOR (RFC 8949), and its range.
#: docs/protocol.md tables them; the handlers' readers enforce them.
TYPES: dict[str, str] = {
    "uint": "unsigned integer (major type 0), in the range the field gives",
    "int": "integer (major type 0 or 1), in the range the field gives",
    "size": "unsigned integer, a byte count in [0, 2^63-1]",
    "address": "unsigned integer, a device address in [0, 2^64-1]; 0 is the null pointer",
    "handle": "unsigned integer in [1, 2^64-1]: a per-session id the worker gave out "
    "(an optional handle may be absent, null or 0 for none)",
    "dim3": "a launch dimension: an array of 1 to 3 unsigned integers in [1, 2^31-1] "
    "(missing ones are 1), or one such integer",
    "text": "text string (major type 3), UTF-8",
    "bytes": "byte string (major type 2)",
    "bool": "true or false (simple values 20, 21)",
    "float": "floating-point number (major type 7), or an integer",
    "map": "map (major type 5) with text keys",
    "any": "any CBOR value",
    "[uint]": "array of unsigned integers",
    "[bytes]": "array of byte strings",
    "[text]": "array of text strings",
    "[map]": "array of maps",
}


@dataclass(frozen=True, slots=True)
class Field:
    """One key of a request or reply map."""

    #: The CBOR map key.
    name: str
    #: One of :data:`TYPES`.
    type: str
    #: What the value means.
    doc: str
    #: False: the key may be absent (or null); ``default`` says what that means.
    required: bool = True
    default: str = ""
    #: The value's unit, where it has one ("bytes", "seconds", "ms").
    unit: str = ""
    #: Inclusive bounds the worker enforces beyond the type's own, as text ("[0, 255]").
    range: str = ""

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise TypeError(f"field {self.name!r}: unknown wire type {self.type!r}")


def field(
    type: str,
    doc: str,
    *,
    required: bool = True,
    default: str = "",
    unit: str = "",
    range: str = "",
) -> str:
    """A request field of a :class:`Message` class. Typed as its key (a ``str``): the
    class decorator :func:`message` replaces it with its name once it has kept the
    declaration, so ``Malloc.size`` is ``"size"`` at run time too."""
    return cast(str, Field("", type, doc, required, default, unit, range))


def Out(
    name: str,
    type: str,
    doc: str,
    *,
    required: bool = True,
    unit: str = "",
) -> Field:
    """A reply field."""
    return Field(name, type, doc, required, unit=unit)


class FieldGroup:
    """Fields that several messages share (a base class of theirs, :func:`fields_of`)."""

    #: The fields, in declaration order (inherited ones first).
    fields: ClassVar[tuple[Field, ...]] = ()


class Message(FieldGroup):
    """A request and its reply, declared once. Subclasses are filled in by :func:`message`."""

    opcode: ClassVar[Opcode]
    #: Reply fields of a success.
    reply: ClassVar[tuple[Field, ...]] = ()
    #: The reply map may carry keys not declared here (a status map): clients ignore them.
    reply_open: ClassVar[bool] = False
    #: May be sent with NO_REPLY; others sent so are refused.
    fire_and_forget: ClassVar[bool] = False
    #: The request's raw bulk bytes may continue in DATA frames (its first frame has MORE).
    streams_request: ClassVar[bool] = False
    #: What the request's raw bytes after its CBOR map are, if it carries any.
    request_bulk: ClassVar[str] = ""
    #: What the reply's raw bytes are, if any (large ones come in REPLY|MORE frames first).
    reply_bulk: ClassVar[str] = ""
    #: Several calls in one frame (protocol 1.1): what each item stands for.
    batch_of: ClassVar[str] = ""
    #: The protocol minor version that added it.
    since_minor: ClassVar[int] = 0
    #: Answered by the worker's connection itself, not a session's handler: what it does.
    connection: ClassVar[str] = ""

    @classmethod
    def field_named(cls, name: str) -> Field:
        """The declared request field ``name``; KeyError if there is none."""
        for declared in cls.fields:
            if declared.name == name:
                return declared
        raise KeyError(f"{cls.opcode.name} declares no request field {name!r}")

    @classmethod
    def request_keys(cls) -> frozenset[str]:
        """The request's keys."""
        return frozenset(f.name for f in cls.fields)

    @classmethod
    def required_keys(cls) -> frozenset[str]:
        """The keys a request must carry."""
        return frozenset(f.name for f in cls.fields if f.required)

    @classmethod
    def reply_keys(cls) -> frozenset[str]:
        """The success reply's keys."""
        return frozenset(f.name for f in cls.reply)

    @classmethod
    def problems(cls, wire: object, *, reply: bool = False) -> list[str]:
        """What is wrong with ``wire`` as this message's request (or its success reply):
        missing required keys, undeclared keys, values not of their declared wire type.
        Empty when it conforms. For tests and tools: requests are never checked this way
        on the per-call path (the worker's handlers check what they read)."""
        fields = cls.reply if reply else cls.fields
        if wire is None:
            wire = {}
        if not isinstance(wire, dict):
            return [f"{cls.opcode.name}: not a map but {type(wire).__name__}"]
        found = []
        declared = {f.name: f for f in fields}
        for key in wire:
            if key not in declared and not (reply and cls.reply_open):
                found.append(f"{cls.opcode.name}: undeclared key {key!r}")
        for f in fields:
            value = wire.get(f.name)
            if value is None:
                if f.required and not (reply and cls.reply_open):
                    found.append(f"{cls.opcode.name}: missing {f.name!r}")
                continue
            if not conforms(f.type, value, optional=not f.required):
                found.append(f"{cls.opcode.name}: {f.name!r} is not {f.type}: {value!r:.60}")
        return found


def _uint(value: object, high: int = 2**64 - 1, low: int = 0) -> bool:
    return type(value) is int and low <= value <= high


def conforms(type_name: str, value: object, *, optional: bool = False) -> bool:
    """True when ``value`` (decoded CBOR) is of the wire type ``type_name`` (:data:`TYPES`)."""
    if type_name.startswith("["):
        inner = type_name[1:-1]
        return isinstance(value, list) and all(conforms(inner, v) for v in value)
    if type_name == "uint":
        return _uint(value)
    if type_name == "int":
        return type(value) is int
    if type_name == "size":
        return _uint(value, 2**63 - 1)
    if type_name == "address":
        return _uint(value)
    if type_name == "handle":
        return _uint(value, low=0 if optional else 1)
    if type_name == "dim3":
        items = value if isinstance(value, list) else [value]
        return 1 <= len(items) <= 3 and all(_uint(v, 2**31 - 1, 1) for v in items)
    if type_name == "float":
        return type(value) in (int, float)
    if type_name == "map":
        return isinstance(value, dict)
    if type_name == "any":
        return True
    wanted = {"text": str, "bytes": bytes, "bool": bool}[type_name]
    return type(value) is wanted


#: Every declaration, by opcode value (filled as the declaring modules are imported).
MESSAGES: dict[int, type[Message]] = {}

M = TypeVar("M", bound=type[Message])


def message(
    opcode: Opcode,
    *,
    reply: tuple[Field, ...] = (),
    reply_open: bool = False,
    fire_and_forget: bool = False,
    streams_request: bool = False,
    request_bulk: str = "",
    reply_bulk: str = "",
    batch_of: str = "",
    since_minor: int = 0,
    connection: str = "",
) -> Any:
    """Declare the decorated class as ``opcode``'s message: its :func:`field` attributes
    become its request fields (and their keys), the arguments what the call is. Refuses
    a second declaration of one opcode, and a key declared twice."""

    def declare(cls: M) -> M:
        if opcode in MESSAGES:
            raise TypeError(f"{opcode.name} is declared twice: {MESSAGES[opcode].__name__}")
        cls.opcode = opcode
        cls.fields = _collect_fields(cls)
        cls.reply = reply
        cls.reply_open = reply_open
        cls.fire_and_forget = fire_and_forget
        cls.streams_request = streams_request
        cls.request_bulk = request_bulk
        cls.reply_bulk = reply_bulk
        cls.batch_of = batch_of
        cls.since_minor = since_minor
        cls.connection = connection
        _unique(cls.__name__ + " reply", [f.name for f in reply])
        MESSAGES[opcode] = cls
        return cls

    return declare


G = TypeVar("G", bound=type[FieldGroup])


def fields_of(cls: G) -> G:
    """Declare a group of fields that several messages share (a base class of theirs):
    its :func:`field` attributes become their keys, as :func:`message` does."""
    cls.fields = _collect_fields(cls)
    return cls


def _collect_fields(cls: type) -> tuple[Field, ...]:
    inherited: list[Field] = []
    for base in reversed(cls.__mro__[1:]):
        inherited.extend(vars(base).get("_declared", ()))
    own: list[Field] = []
    for name, value in list(vars(cls).items()):
        if isinstance(value, Field):
            declared = Field(
                name, value.type, value.doc, value.required, value.default, value.unit, value.range
            )
            own.append(declared)
            setattr(cls, name, name)  # the attribute is the key from now on
    cls._declared = tuple(own)  # type: ignore[attr-defined]
    merged = [f for f in inherited if f.name not in {o.name for o in own}] + own
    _unique(cls.__name__, [f.name for f in merged])
    return tuple(merged)


def _unique(where: str, names: list[str]) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise TypeError(f"{where}: field {name!r} is declared twice")
        seen.add(name)


def declared(opcode: int) -> type[Message] | None:
    """The declaration of ``opcode``, or None for an opcode nothing declares."""
    return MESSAGES.get(opcode)
