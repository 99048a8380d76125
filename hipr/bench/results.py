"""What a ``hipr bench`` run found: its passes (``Run``) and how they are shown, as rich
tables, Markdown (for ``benchmarks/results/``) or JSON."""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOOPS = ("trio", "asyncio")
#: What the --local worker may run on: the client loops, and uvloop (hipr worker's default).
WORKER_LOOPS = (*LOOPS, "uvloop")
#: The client "loop" of the floor and sync runs: blocking sockets, no event loop.
BLOCKING = "blocking"
TRANSPORTS = ("tcp", "unix")


@dataclass(slots=True)
class Run:
    """One pass of the suite: one URL, one client loop."""

    transport: str
    loop: str
    worker_loop: str | None
    url: str
    baseline_url: str
    rows: list[Any] = field(default_factory=list)
    #: What the run could not measure, and checks worth reading beside the figures.
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The run as plain data."""
        return {
            "transport": self.transport,
            "loop": self.loop,
            "worker_loop": self.worker_loop,
            "url": self.url,
            "baseline_url": self.baseline_url,
            "rows": [row.to_json() for row in self.rows],
            "notes": list(self.notes),
        }


def machine_description() -> dict[str, Any]:
    """Host name, CPU model and count, OS and Python: what the figures were taken on."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "host": platform.node(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _ratio_text(row: Any, ratio: float | None = None, local: bool = False) -> str:
    ratio = (row.local_ratio if local else row.ratio) if ratio is None else ratio
    if ratio is None:
        return ""
    return f"{ratio * 100:.0f} %" if row.ratio_style == "%" else f"{ratio:.2f}x"


def _has_local(run: Run) -> bool:
    return any(getattr(row, "local_value", None) is not None for row in run.rows)


def _value_text(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    if unit == "req/s":
        return f"{value:,.0f} {unit}"
    if unit == "GB/s":
        return f"{value:.2f} {unit}"
    return f"{value:,.1f} {unit}"


def _met_text(met: bool | None) -> str:
    return "" if met is None else ("met" if met else "MISSED")


#: What ``--quick`` output says first: its counts are too small to mean anything.
QUICK_NOTE = (
    "quick run (--quick): tiny counts that check every benchmark runs; the figures "
    "measure nothing, so no goal is judged"
)


def _run_title(run: Run) -> str:
    worker = f", worker {run.worker_loop}" if run.worker_loop else ""
    client = "sync client (blocking sockets)" if run.loop == BLOCKING else f"client {run.loop}"
    return f"{run.transport}, {client}{worker}: {run.url}"


def print_tables(runs: Sequence[Run], meta: dict[str, Any]) -> None:
    """The results as rich tables on the terminal."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=200)
    console.print(
        f"[bold]hipr bench[/] {meta['date']} on {meta['machine']['host']} "
        f"({meta['machine']['cpus']} CPUs), backend {meta.get('backend', '?')}"
        f"{' / ' + meta['device'] if meta.get('device') else ''}"
    )
    quick = bool(meta.get("quick"))
    if quick:
        console.print(QUICK_NOTE)
    for run in runs:
        table = Table(title=_run_title(run), box=box.SIMPLE_HEAD, title_justify="left")
        table.add_column("benchmark", overflow="fold")
        table.add_column("hipr", justify="right", no_wrap=True)
        table.add_column("baseline (same run)", overflow="fold")
        table.add_column("baseline", justify="right", no_wrap=True)
        table.add_column("ratio", justify="right", no_wrap=True)
        local = _has_local(run)
        if local:
            table.add_column("local (same run)", justify="right", no_wrap=True)
            table.add_column("vs local", justify="right", no_wrap=True)
        table.add_column("goal", no_wrap=True)
        table.add_column("", no_wrap=True)
        for row in run.rows:
            met = "" if quick else _met_text(row.met)
            style = "" if quick else ("red" if row.met is False else ("green" if row.met else ""))
            cells = [
                row.name,
                _value_text(row.value, row.unit),
                row.baseline,
                _value_text(row.baseline_value, row.unit),
                _ratio_text(row),
            ]
            if local:
                cells += [_value_text(row.local_value, row.unit), _ratio_text(row, local=True)]
            cells += [row.goal, f"[{style}]{met}[/]" if style else met]
            table.add_row(*cells)
        console.print(table)
        for note in run.notes:
            console.print(f"  note: {note}")
    goals = [row.met for run in runs for row in run.rows if row.met is not None]
    if goals and not quick:
        console.print(f"goals met: {sum(goals)} of {len(goals)}")


def markdown(runs: Sequence[Run], meta: dict[str, Any]) -> str:
    """The results as a Markdown document (for ``benchmarks/results/``)."""
    m = meta["machine"]
    lines = [
        f"# hipr bench: {meta.get('backend', '?')}, "
        f"{', '.join(sorted({r.transport for r in runs}))}",
        "",
        f"- date: {meta['date']}",
        f"- machine: {m['host']}: {m['cpu']}, {m['cpus']} CPUs, {m['os']}, Python {m['python']}"
        f"; load average at start {m.get('load_average', '?')}",
        f"- backend: {meta.get('backend', '?')}"
        + (f" ({meta['device']})" if meta.get("device") else ""),
        f"- transports: {', '.join(sorted({r.transport for r in runs}))}",
        "- event loops (client / worker): "
        + ", ".join(sorted({f"{r.loop} / {r.worker_loop or '?'}" for r in runs})),
        f"- hipr {meta['hipr_version']}; command: `{meta['command']}`",
        "",
        "Each figure beside its baseline measured in the same run; ratio = hipr / baseline "
        "(x for times and rates, % for a share of the baseline's throughput). In the sync "
        "client's runs the baseline is the machine's floor (blocking sockets, or the local "
        "runtime for GPU-bound work), and `vs local` compares with the same work done by "
        "the runtime in-process.",
    ]
    if meta.get("quick"):
        lines += ["", f"**{QUICK_NOTE}.**"]
    for run in runs:
        local = _has_local(run)
        head = "| benchmark | hipr | baseline (same run) | baseline | ratio |"
        rule = "|---|--:|---|--:|--:|"
        if local:
            head += " local | vs local |"
            rule += "--:|--:|"
        lines += ["", f"## {_run_title(run)}", "", head + " goal | |", rule + "---|---|"]
        for row in run.rows:
            line = (
                f"| {row.name} | {_value_text(row.value, row.unit)} | {row.baseline} | "
                f"{_value_text(row.baseline_value, row.unit)} | {_ratio_text(row)} |"
            )
            if local:
                line += (
                    f" {_value_text(row.local_value, row.unit)} | {_ratio_text(row, local=True)} |"
                )
            verdict = "" if meta.get("quick") else _met_text(row.met)
            lines.append(line + f" {row.goal} | {verdict} |")
        notes = [f"{row.name}: {row.note}" for row in run.rows if row.note] + run.notes
        if notes:
            lines += ["", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"


def results_json(runs: Sequence[Run], meta: dict[str, Any]) -> dict[str, Any]:
    """The results as one JSON-able document."""
    return {"meta": meta, "runs": [run.to_json() for run in runs]}


def write_split(path: str, runs: Sequence[Run], render: Any) -> list[Path]:
    """Write ``render(runs)`` to ``path``, one file per transport when it has {transport}."""
    written: list[Path] = []
    groups = (
        {t: [r for r in runs if r.transport == t] for t in dict.fromkeys(r.transport for r in runs)}
        if "{transport}" in path
        else {"": list(runs)}
    )
    for transport, group in groups.items():
        target = Path(path.replace("{transport}", transport))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(group))
        written.append(target)
    return written
