"""Summarise a HIPR_PROXY_TRACE=2 log of the export-table spy (etbl_spy.c) or of the
proxy: each private table as the driver described it, then each table slot called (how
often, and its first calls with their arguments and result), then each driver entry
point called with its results.

    python3 tests/proxy/cuda/spy_summary.py LOG [EXAMPLES]
"""

from __future__ import annotations

import collections
import re
import sys

CALL = re.compile(r"^hipr trace: (etbl \w+\[\d+\]|cu\w+)(.*) -> (-?\d+)")


def summarise(lines: list[str], examples: int = 3) -> list[str]:
    """The summary's lines."""
    out = ["-- private tables as handed out"]
    out += [ln for ln in lines if ln.startswith("hipr spy: table") or ln.startswith("hipr spy:   ")]
    slot_calls: dict[str, list[str]] = collections.defaultdict(list)
    api: collections.Counter[tuple[str, str]] = collections.Counter()
    for ln in lines:
        m = CALL.match(ln)
        if not m:
            continue
        name = m.group(1)
        if name.startswith("etbl "):
            slot_calls[name].append(ln.removeprefix("hipr trace: "))
        else:
            api[(name, m.group(3))] += 1
    out.append("-- private table slots called (count, first calls)")
    for name, calls in sorted(slot_calls.items()):
        out.append(f"{name}: {len(calls)} calls")
        out += [f"    {c}" for c in calls[:examples]]
    out.append("-- driver entry points called (name, result, count)")
    out += [f"{n} -> {rc}: {k}" for (n, rc), k in sorted(api.items())]
    out += [ln for ln in lines if "not served" in ln or "signal" in ln or "called from" in ln]
    return out


if __name__ == "__main__":
    with open(sys.argv[1], errors="replace") as f:
        text = f.read().splitlines()
    print("\n".join(summarise(text, int(sys.argv[2]) if len(sys.argv) > 2 else 3)))
