"""The CUDA driver proxy's coverage table for docs/proxy.md, read from the C sources: each
entry point ``cuda_served.def`` serves with the forms it is exported and looked up as, and
the names of NVIDIA's driver that exist only as stubs."""

from __future__ import annotations

import re
from pathlib import Path

NATIVE = Path(__file__).resolve().parent / "native"
BEGIN = "<!-- BEGIN GENERATED: CUDA proxy coverage (scripts/gen-proxy-tables) -->"
END = "<!-- END GENERATED: CUDA proxy coverage -->"

_SERVED = re.compile(r"^X\((\w+), (\d+), (\w+)\)", re.M)
_ALIAS_MACRO = re.compile(r"^ALIAS\(\w+, (\w+), (\w+),", re.M)
_ALIAS_ATTR = re.compile(
    r"^API [^(]*?\b(cu\w+)\([^;]*?\)\s*__attribute__\(\(alias\(\"(\w+)\"\)\)\)", re.M
)
_API = re.compile(r"^API [^(]*?\b(cu\w+)\(", re.M)
_PER_THREAD = re.compile(r"_pt[sd][sz]$")


def _sources() -> str:
    return "".join(p.read_text() for p in sorted(NATIVE.glob("cuda_*.c")))


def _version(since: int) -> str:
    return f"{since // 1000}.{since % 1000 // 10}"


def served() -> dict[str, list[str]]:
    """Base name -> its exported forms, each with the CUDA version cuGetProcAddress gives
    it from (the per-thread-stream forms marked ``ptsz``/``ptds``)."""
    table: dict[str, list[str]] = {}
    base_of: dict[str, str] = {}
    for base, since, symbol in _SERVED.findall((NATIVE / "cuda_served.def").read_text()):
        table.setdefault(base, []).append(f"`{symbol}` ({_version(int(since))})")
        base_of[symbol] = base
    text = _sources()
    listed = set(base_of)
    for name, target in [*_ALIAS_MACRO.findall(text), *_ALIAS_ATTR.findall(text)]:
        table.setdefault(base_of.get(target, target), []).append(f"`{name}`")
        listed.add(name)
    # Forms defined apart (a per-thread form with its own answer), under their base name.
    for name in sorted(set(_API.findall(text)) - listed):
        plain = _PER_THREAD.sub("", name)
        if plain != name:
            table.setdefault(base_of.get(plain, plain), []).append(f"`{name}`")
    return dict(sorted(table.items()))


def stubs() -> list[str]:
    """Names of NVIDIA's driver that libcuda.so.1 exports only as stubs."""
    text = _sources()
    defined = set(_API.findall(text))
    defined.update(name for name, _ in _ALIAS_MACRO.findall(text))
    names = (line.strip() for line in (NATIVE / "cuda_symbols.txt").read_text().splitlines())
    return sorted(n for n in names if n and not n.startswith("#") and n not in defined)


def folded(summary: str, names: list[str]) -> list[str]:
    """Lines of a folded list of function names (shared with the HIP coverage table)."""
    return [
        f"<details><summary>{summary}</summary>",
        "",
        ", ".join(f"`{n}`" for n in names),
        "",
        "</details>",
    ]


def render() -> str:
    """The generated block, markers included."""
    rows = served()
    left = stubs()
    lines = [
        BEGIN,
        "",
        f"{len(rows)} driver entry points served, with {sum(map(len, rows.values()))} exported "
        f"forms; the other {len(left)} names of NVIDIA's driver exist and return "
        "`CUDA_ERROR_NOT_SUPPORTED`, naming themselves once on stderr. The version beside a "
        "form is the CUDA version from which `cuGetProcAddress` gives it for the base name.",
        "",
        "| entry point | exported forms |",
        "|---|---|",
        *(f"| `{base}` | {', '.join(forms)} |" for base, forms in rows.items()),
        "",
        *folded("the names that exist only as stubs", left),
        "",
        END,
    ]
    return "\n".join(lines)


def replace_block(text: str, begin: str, end: str, block: str) -> str:
    """``text`` with the part from ``begin`` to ``end`` (both markers included) replaced
    by ``block`` (which carries its own markers)."""
    start, stop = text.index(begin), text.index(end) + len(end)
    return text[:start] + block + text[stop:]


def update(text: str) -> str:
    """``text`` with its generated block replaced by :func:`render`."""
    return replace_block(text, BEGIN, END, render())
