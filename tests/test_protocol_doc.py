"""docs/protocol.md is generated from the message declarations and says all of them: a
client in another language is written from it (the native proxies are)."""

from __future__ import annotations

import re
from pathlib import Path

import hipr
from hipr.cli.protocol_doc import protocol_markdown
from hipr.protocol import FrameDecoder, Opcode
from hipr.protocol import messages as m

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "protocol.md"


def test_the_committed_page_is_what_the_declarations_generate() -> None:
    assert PAGE.read_text() == protocol_markdown(), "docs/protocol.md is stale: scripts/gen-docs"


def _section(text: str, name: str) -> str:
    start = text.index(f"#### {name}\n")
    end = text.find("\n#### ", start + 1)
    return text[start : end if end > 0 else None]


def test_every_message_documents_its_fields_and_flags() -> None:
    text = PAGE.read_text()
    for opcode, declaration in m.MESSAGES.items():
        section = _section(text, opcode.name)
        assert f"`0x{opcode.value:04x}`" in section
        for f in (*declaration.fields, *declaration.reply):
            assert re.search(rf"^\| `{f.name}` \| `{re.escape(f.type)}` \|", section, re.M), (
                f"{opcode.name}.{f.name} is missing from docs/protocol.md"
            )
        said = "fire-and-forget allowed" if declaration.fire_and_forget else "replies"
        if opcode is Opcode.DATA:
            said = "never answered on its own"
        assert said in section.splitlines()[2], opcode.name
        if declaration.streams_request:
            assert "DATA frames" in section


def test_the_page_states_the_rules_a_client_needs() -> None:
    text = PAGE.read_text()
    for heading in (
        "## Frames",
        "## CBOR",
        "## Bulk data",
        "## Request ids, order, fire-and-forget",
        "## Handshake",
        "## Heartbeats",
        "## RESUME and exactly-once",
        "## Errors",
        "## Limits",
        "## Opcodes",
        "## Example frames",
    ):
        assert f"\n{heading}\n" in text, heading
    for code in ("hipErrorInvalidValue", "hipErrorNotSupported", "hipErrorUnknown"):
        assert f"`{code}` |" in text
    assert "DESIGN.md" not in text


def test_the_example_frames_decode_to_what_they_say() -> None:
    text = PAGE.read_text()
    examples = text[text.index("## Example frames") :]
    blocks = re.findall(r"```\n(.*?)\n```", examples, re.S)
    assert len(blocks) >= 5
    opcodes = []
    for block in blocks:
        decoder = FrameDecoder()
        decoder.feed(bytes.fromhex(block.replace("\n", " ")))
        frame = decoder.next_frame()
        assert frame is not None and frame.error is None and decoder.buffered == 0
        opcodes.append(frame.opcode)
        declaration = m.MESSAGES[frame.opcode]
        if frame.args and not frame.flags & 0x4:
            reply = bool(frame.flags & 0x2)
            assert declaration.problems(frame.args, reply=reply) == [], block
    assert Opcode.LAUNCH_KERNEL in opcodes and Opcode.PING in opcodes


def test_the_codec_cites_no_file_outside_the_repository() -> None:
    protocol = Path(hipr.__file__).parent / "protocol"
    for path in protocol.rglob("*.py"):
        assert "DESIGN.md" not in path.read_text(), path
