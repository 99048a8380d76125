"""Soak: is the worker flat once warm? The trend of each sampled figure over the last
half of a long load run, and the report that states it.

A leak shows as a slope; allocator noise (arenas, fragmentation, the garbage collector's
timing) shows as scatter around a flat line. So each figure gets a least-squares line
over the samples of the last half, and its drift over that half (slope x span) is
compared with the scatter: growing when it rises past a floor too small to matter
(``floor``) and either past the noise band (twice the residuals' standard deviation) or
with a slope significantly above zero (a wide scatter must not hide a steady rise).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hipr.testing.load import LoadReport, Sample

#: Drift too small to call growth, whatever the scatter: 2 MiB of RSS (a few allocator
#: arenas' worth), less than one descriptor or thread.
FLOORS: dict[str, float] = {
    "rss": 2.0 * 2**20,
    "fds": 0.5,
    "threads": 0.5,
    "gc_objects": 500,
    "rss_peak": 2.0 * 2**20,
}
#: Shown with its trend but not in the verdict: the peak under load follows how the
#: sessions' requests happened to overlap, the idle figures are what a leak moves.
INFORMATIVE = frozenset({"rss_peak"})


@dataclass(frozen=True, slots=True)
class Trend:
    """A least-squares line through one figure's samples over the last half."""

    name: str
    first: float
    last: float
    #: Units per minute.
    slope: float
    #: ``slope`` times the span of the samples fitted: how much the line rose.
    drift: float
    #: Two standard deviations of the residuals around the line.
    noise: float
    #: The 95 % interval of the slope (units per minute), from its standard error.
    slope_ci: float
    samples: int
    floor: float

    def _moves(self, drift: float, slope_low: float) -> bool:
        # Past the floor, and either past the noise band or significant: a scatter wide
        # enough to swallow a steady rise must not hide it.
        return drift > self.floor and (drift > self.noise or slope_low > 0)

    @property
    def growing(self) -> bool:
        """True when the line rises past the floor, and past the noise band or with a
        slope whose 95 % interval excludes zero."""
        return self._moves(self.drift, self.slope - self.slope_ci)

    @property
    def falling(self) -> bool:
        """The mirror of :attr:`growing`."""
        return self._moves(-self.drift, -self.slope - self.slope_ci)

    @property
    def flat(self) -> bool:
        """Neither growing nor falling."""
        return not (self.growing or self.falling)

    @property
    def verdict(self) -> str:
        """``flat``, ``falling`` or ``GROWING``."""
        return "flat" if self.flat else ("GROWING" if self.growing else "falling")


def fit(name: str, points: Sequence[tuple[float, float]], floor: float = 0.0) -> Trend:
    """The least-squares line through ``points`` (seconds, value)."""
    n = len(points)
    if n == 0:
        return Trend(name, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, floor)
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    if n < 3:
        return Trend(name, ys[0], ys[-1], 0.0, ys[-1] - ys[0], 0.0, math.inf, n, floor)
    mx = sum(xs) / n
    my = sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx if sxx else 0.0
    residuals = [y - (my + slope * (x - mx)) for x, y in zip(xs, ys, strict=True)]
    sigma = math.sqrt(sum(r * r for r in residuals) / (n - 2))
    slope_se = sigma / math.sqrt(sxx) if sxx else math.inf
    return Trend(
        name=name,
        first=ys[0],
        last=ys[-1],
        slope=slope * 60,
        drift=slope * (xs[-1] - xs[0]),
        noise=2 * sigma,
        slope_ci=1.96 * slope_se * 60,
        samples=n,
        floor=floor,
    )


FIGURES: dict[str, Callable[[Sample], float]] = {
    "rss": lambda s: float(s.rss),
    "fds": lambda s: float(s.fds),
    "threads": lambda s: float(s.threads),
    "gc_objects": lambda s: float(s.gc_objects),
    "rss_peak": lambda s: float(s.rss_peak),
}


def last_half_trends(samples: Sequence[Sample]) -> dict[str, Trend]:
    """Each figure's trend over the samples taken in the second half of the run."""
    if not samples:
        return {name: fit(name, [], FLOORS[name]) for name in FIGURES}
    half = samples[-1].t / 2
    tail = [s for s in samples if s.t >= half]
    return {
        name: fit(name, [(s.t, get(s)) for s in tail], FLOORS[name])
        for name, get in FIGURES.items()
    }


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f}"


def render_soak(report: LoadReport, *, title: str) -> str:
    """The soak report in Markdown: the verdict table, each figure's trend, every sample."""
    trends = last_half_trends(report.samples)
    ok = soak_ok(report)
    minutes = report.samples[-1].t / 60 if report.samples else 0.0
    lines = [
        title,
        "",
        "| metric | value |",
        "|--------|-------|",
        f"| soak | {minutes:.1f} min of load, {len(report.samples)} rounds of "
        f"{report.sessions} sessions (sampled after each, its sessions closed) |",
        f"| sessions held | {report.sessions_held} at once ({report.sessions} asked) |",
        f"| requests verified | {report.verified:,} checks over {report.requests:,} requests |",
        f"| errors / leaks / crashes | {len(report.errors)} / {len(report.leaks)} / "
        f"{len(report.crashes)} |",
        f"| p50/p99 latency | {report.p50_ms:.2f} / {report.p99_ms:.2f} ms per call (median "
        "round's p50, worst round's p99) |",
    ]
    for name, trend in trends.items():
        if name == "rss_peak":
            first_peak = _mib(report.samples[0].rss_peak) if report.samples else "-"
            lines.append(
                f"| worker RSS peak in rounds | first {first_peak}, last {_mib(trend.last)} MiB; "
                f"last half: slope {_mib(trend.slope)} MiB/min, "
                f"drift {_mib(trend.drift)} MiB vs noise band ± {_mib(trend.noise)} MiB "
                "(informative: not in the verdict) |"
            )
        elif name == "rss":
            lines.append(
                f"| worker RSS, idle after each round | {_mib(report.rss_start)} MiB before "
                "load; after round 1 "
                f"{_mib(report.samples[0].rss) if report.samples else '-'}, last "
                f"{_mib(trend.last)} MiB; last half: slope {_mib(trend.slope)} MiB/min "
                f"(± {_mib(trend.slope_ci)} at 95 %), drift {_mib(trend.drift)} MiB vs noise "
                f"band ± {_mib(trend.noise)} MiB: {trend.verdict} |"
            )
        else:
            label = {"fds": "open fds", "threads": "threads", "gc_objects": "gc objects"}[name]
            first = report.samples[0] if report.samples else None
            start = "-" if first is None else f"{FIGURES[name](first):.0f}"
            lines.append(
                f"| {label} | after round 1 {start}, last {trend.last:.0f}; last half: slope "
                f"{trend.slope:+.2f}/min (± {trend.slope_ci:.2f}), drift {trend.drift:+.1f} vs "
                f"noise band ± {trend.noise:.1f}: {trend.verdict} |"
            )
    lines.append(f"| verdict | {'PASS' if ok else 'FAIL'} |")
    lines += [
        "",
        "Growing means the least-squares line through the last half's samples rises by "
        "more than a floor (2 MiB of RSS / one descriptor / one thread / 500 objects) and "
        "either by more than twice the residuals' standard deviation (the noise band) or "
        "with a slope whose 95 % interval excludes zero; falling is the mirror, flat is "
        "neither. The verdict fails only on growth.",
        "",
        f"- load: {report.summary()}",
    ]
    if report.trace_top:
        lines += ["", "tracemalloc, half time to end, largest growth first:", ""]
        lines += [f"- {line}" for line in report.trace_top]
    lines += [
        "",
        "| round | t (s) | RSS (MiB) | peak RSS (MiB) | fds | threads | gc objects | p50 (ms) "
        "| p99 (ms) |",
        "|------:|------:|----------:|---------------:|----:|--------:|-----------:|---------:"
        "|---------:|",
    ]
    for i, s in enumerate(report.samples, 1):
        lines.append(
            f"| {i} | {s.t:.0f} | {_mib(s.rss)} | {_mib(s.rss_peak)} | {s.fds} | {s.threads} "
            f"| {s.gc_objects} | "
            f"{s.p50_ms:.2f} | {s.p99_ms:.2f} |"
        )
    return "\n".join(lines) + "\n"


def soak_ok(report: LoadReport) -> bool:
    """The soak's verdict: the load's oracles held and every figure is flat."""
    trends = last_half_trends(report.samples)
    return (
        report.ok
        and len(report.samples) >= 6
        and not any(t.growing for name, t in trends.items() if name not in INFORMATIVE)
    )
