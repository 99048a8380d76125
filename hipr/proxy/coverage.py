"""The proxy's coverage table for docs/proxy.md, read from the C sources: each exported
function of the HIP and hiprtc fronts, served or present-but-refusing (``STUB``)."""

from __future__ import annotations

import re
from pathlib import Path

from hipr.proxy import cuda_coverage

NATIVE = Path(__file__).resolve().parent / "native"
BEGIN = "<!-- BEGIN GENERATED: proxy coverage (scripts/gen-proxy-tables) -->"
END = "<!-- END GENERATED: proxy coverage -->"

#: Sources of each library's exported functions.
_SERVED = {
    "libamdhip64.so": ("hip_front.c", "hip_extras.c", "hipcc.c", "modules.c", "hip_symbols.c"),
    "libhiprtc.so": ("hiprtc_front.c",),
}
_API = re.compile(r"^API [^(]*?\b((?:hip|__hip)\w+)\(", re.M)
_STUB = re.compile(r"^STUB\((\w+),", re.M)
_GSTUB = re.compile(r"^GSTUB\((\w+)\)", re.M)
_RTC_STUB = re.compile(r"^RTC_STUB\((\w+)\)", re.M)
_EXPORTED_NOOP = re.compile(r"^HIPR_EXPORT [^(]*?\b(__hip\w+)\(", re.M)


def defined_names() -> set[str]:
    """Functions the C sources define by hand, served or stubbed (what the generated
    stubs must leave out)."""
    names: set[str] = set()
    for sources in _SERVED.values():
        for source in sources:
            names.update(_API.findall((NATIVE / source).read_text()))
    names.update(_STUB.findall((NATIVE / "stubs.c").read_text()))
    names.update(_EXPORTED_NOOP.findall((NATIVE / "hipcc.c").read_text()))
    return names


def generated_stubs() -> list[str]:
    """HIP functions that exist only as generated stubs (gen_stubs.h)."""
    return _GSTUB.findall((NATIVE / "gen_stubs.h").read_text())


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
    rtc = (NATIVE / "hiprtc_front.c").read_text()
    rows += [
        (n, "libhiprtc.so", "exists, returns HIPRTC_ERROR_INTERNAL_ERROR")
        for n in _RTC_STUB.findall(rtc)
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
    generated = generated_stubs()
    lines = [
        BEGIN,
        "",
        f"{served} functions served, {len(rows) - served + len(generated)} present without "
        "being served.",
        "",
        "| function | library | status |",
        "|---|---|---|",
        *(f"| `{name}` | {library} | {status} |" for name, library, status in rows),
        "",
        f"The other {len(generated)} HIP functions that hip-python loads and that return "
        "`hipError_t` exist in libamdhip64.so and return `hipErrorNotSupported`, naming "
        "themselves once on stderr (generated from hip-python's declarations into "
        "`gen_stubs.h`):",
        "",
        *cuda_coverage.folded("their names", generated),
        "",
        END,
    ]
    return "\n".join(lines)


def update(doc: Path) -> str:
    """``doc``'s text with its generated blocks replaced: :func:`render`'s, and the CUDA
    proxy's (:mod:`hipr.proxy.cuda_coverage`)."""
    ours = cuda_coverage.replace_block(doc.read_text(), BEGIN, END, render())
    return cuda_coverage.update(ours)
