"""The proxy's coverage table for docs/proxy.md, read from the C sources: each exported
function of the HIP and hiprtc fronts, served or present-but-refusing (``STUB``)."""

from __future__ import annotations

import re
from pathlib import Path

NATIVE = Path(__file__).resolve().parent / "native"
BEGIN = "<!-- BEGIN GENERATED: proxy coverage (scripts/gen-proxy-tables) -->"
END = "<!-- END GENERATED: proxy coverage -->"

#: Sources of each library's exported functions.
_SERVED = {
    "libamdhip64.so": ("hip_front.c", "hip_extras.c", "hipcc.c", "modules.c"),
    "libhiprtc.so": ("hiprtc_front.c",),
}
_API = re.compile(r"^API [^(]*?\b((?:hip|__hip)\w+)\(", re.M)
_STUB = re.compile(r"^STUB\((\w+),", re.M)
_EXPORTED_NOOP = re.compile(r"^HIPR_EXPORT [^(]*?\b(__hip\w+)\(", re.M)


def coverage() -> list[tuple[str, str, str]]:
    """(function, library, status) rows, sorted by library then name."""
    rows: list[tuple[str, str, str]] = []
    for library, sources in _SERVED.items():
        for source in sources:
            text = (NATIVE / source).read_text()
            rows += [(name, library, "served") for name in _API.findall(text)]
    stubs = (NATIVE / "stubs.c").read_text()
    rows += [
        (n, "libamdhip64.so", "exists, returns hipErrorNotSupported") for n in _STUB.findall(stubs)
    ]
    hipcc = (NATIVE / "hipcc.c").read_text()
    rows += [
        (n, "libamdhip64.so", "exists (hipcc registration accepted, not served)")
        for n in _EXPORTED_NOOP.findall(hipcc)
    ]
    return sorted(set(rows), key=lambda r: (r[1], r[2] != "served", r[0]))


def render() -> str:
    """The generated block, markers included."""
    rows = coverage()
    served = sum(1 for r in rows if r[2] == "served")
    lines = [
        BEGIN,
        "",
        f"{served} functions served, {len(rows) - served} present without being served.",
        "",
        "| function | library | status |",
        "|---|---|---|",
        *(f"| `{name}` | {library} | {status} |" for name, library, status in rows),
        "",
        END,
    ]
    return "\n".join(lines)


def update(doc: Path) -> str:
    """``doc``'s text with its generated block replaced by :func:`render`."""
    text = doc.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + render() + text[end:]
