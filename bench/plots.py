"""The PNG plots of docs/PERFORMANCE.md, drawn with matplotlib (Agg, no display)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

LABELS = {
    "full": "full history",
    "window_6": "last 6 messages",
    "window_12": "last 12 messages",
    "langchain": "LangChain (system_prompt)",
    "langchain_in_state": "LangChain (system msg in state)",
    "ctxsum": "ctxsum",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def billed_plot(by_file: Mapping[str, Mapping[str, Any]], names: Sequence[str], path: Path) -> Path:
    """Total billed tokens of each side relative to the full history, one group per file."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(names)
    for offset, name in enumerate(names):
        values = [100 * sides[name]["billed_vs"]["full"] for sides in by_file.values()]
        positions = [group + offset * width for group in range(len(by_file))]
        bars = axes.bar(positions, values, width, label=LABELS.get(name, name))
        axes.bar_label(bars, fmt="%.0f", fontsize=7)
    axes.set_xticks([group + 0.4 - width / 2 for group in range(len(by_file))])
    axes.set_xticklabels(list(by_file))
    axes.set_ylabel("tokens billed, % of the full history")
    axes.set_title("Total tokens billed (calls + summarizer in/out), fixed 120-token summary")
    axes.legend(fontsize=8)
    figure.tight_layout()
    return _save(figure, plt, path)


def curves_plot(
    curves: Mapping[str, Sequence[Sequence[float]]], path: Path, *, title: str, log_y: bool = False
) -> Path:
    """Tokens sent per call against the message index, one line per side."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(9, 4.5))
    for name, points in curves.items():
        axes.plot(
            [point[0] for point in points],
            [point[1] for point in points],
            label=LABELS.get(name, name),
            linewidth=1.2,
        )
    axes.set_xlabel("message index of the call")
    axes.set_ylabel("tokens sent")
    if log_y:
        axes.set_yscale("log")
    axes.set_title(title)
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return _save(figure, plt, path)


def scaling_plot(
    series: Mapping[str, Sequence[Sequence[float]]], path: Path, *, title: str, ylabel: str
) -> Path:
    """Per-call time against history length, log-log, one line per side."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for name, points in series.items():
        axes.plot(
            [point[0] for point in points], [point[1] for point in points], marker="o", label=name
        )
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("messages of history (compacted)")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3, which="both")
    figure.tight_layout()
    return _save(figure, plt, path)


def _save(figure: Any, plt: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


SCALING_OPERATIONS = {
    "append": "append (message_append)",
    "context": "context read (context_get)",
    "rest_context": "REST GET …/context/",
}


def _minor_label(value: float, _position: Any) -> str:
    """2, 3 and 5 between the powers of ten of a log axis, nothing else."""
    text = f"{value:g}"
    return text if text.lstrip("0.")[:1] in ("2", "3", "5") else ""


def scaling_operations_plot(backends: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """bench.scaling: one panel per operation, the median ms (line) and the p95 (dotted)
    against the conversation's length, one line per database and kind."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter

    figure, panels = plt.subplots(1, len(SCALING_OPERATIONS), figsize=(13, 4.5), sharex=True)
    styles = {True: "-", False: "--"}
    for axes, (operation, title) in zip(panels, SCALING_OPERATIONS.items(), strict=True):
        for backend, part in backends.items():
            for compacted in (True, False):
                rows = [row for row in part["targets"] if row["compacted"] == compacted]
                sizes = [row["size"] for row in rows]
                medians = [row["operations"][operation]["ms"]["median"] for row in rows]
                p95 = [row["operations"][operation]["ms"]["p95"] for row in rows]
                kind = "compacted" if compacted else "never compacted"
                (line,) = axes.plot(
                    sizes, medians, styles[compacted], marker="o", label=f"{backend}, {kind}"
                )
                axes.plot(sizes, p95, ":", color=line.get_color(), linewidth=1, alpha=0.7)
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axes.yaxis.set_minor_formatter(FuncFormatter(_minor_label))
        axes.tick_params(axis="y", which="minor", labelsize=7)
        axes.set_xlabel("messages in the conversation")
        axes.set_title(title, fontsize=10)
        axes.grid(alpha=0.3, which="both")
    panels[0].set_ylabel("ms per call: median (dotted: p95)")
    panels[1].legend(fontsize=8, loc="upper left")
    figure.suptitle("Per-call wall time against the conversation's length, on a mixed table")
    figure.tight_layout()
    return _save(figure, plt, path)


def throughput_plot(backends: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """bench.throughput: appends per second of ctxsum and of the floor, and compactions per
    second, against the number of processes; one group of bars per database."""
    plt = _pyplot()
    figure, (appends, compactions) = plt.subplots(1, 2, figsize=(12, 4.5))
    groups = [
        (backend, processes, figures["median"])
        for backend, part in backends.items()
        for processes, figures in part["processes"].items()
    ]
    labels = [f"{backend}\nP={processes}" for backend, processes, _ in groups]
    positions = list(range(len(groups)))
    width = 0.38
    floor = appends.bar(
        [x - width / 2 for x in positions],
        [median["floor"] for _, _, median in groups],
        width,
        label="floor (raw SQL: BEGIN, INSERT, UPDATE, COMMIT)",
        color="#bbbbbb",
    )
    ctxsum = appends.bar(
        [x + width / 2 for x in positions],
        [median["append"] for _, _, median in groups],
        width,
        label="ctxsum message_append",
    )
    appends.bar_label(floor, fmt="%.0f", fontsize=7)
    appends.bar_label(
        ctxsum,
        labels=[f"{100 * median['append_vs_floor']:.0f} %" for _, _, median in groups],
        fontsize=7,
    )
    appends.set_xticks(positions, labels, fontsize=8)
    appends.set_ylabel("appends per second, all processes (median of rounds)")
    appends.set_title("Appends: ctxsum (label: % of the floor) against the floor", fontsize=10)
    appends.legend(fontsize=8)
    bars = compactions.bar(positions, [median["compact"] for _, _, median in groups], 0.6)
    compactions.bar_label(bars, fmt="%.1f", fontsize=7)
    compactions.set_xticks(positions, labels, fontsize=8)
    compactions.set_ylabel("compactions per second, all processes (median of rounds)")
    compactions.set_title("Compactions (fixed-size summarizer, no model call)", fontsize=10)
    for axes in (appends, compactions):
        axes.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    return _save(figure, plt, path)


BACKGROUND_PHASES = {
    "idle": "idle",
    "during": "all in flight",
    "whole_waves": "whole waves",
    "idle_after": "idle again",
}


def background_plot(report: Mapping[str, Any], path: Path) -> Path:
    """bench.background: the first wave's appends against the time since the compactions
    were enqueued, with the compactions in flight; and every phase's distribution."""
    plt = _pyplot()
    figure, (wave, boxes) = plt.subplots(
        1, 2, figsize=(12, 4.3), gridspec_kw={"width_ratios": [3, 2]}
    )
    samples = report["first_wave"]
    wave.plot(
        [sample["at"] for sample in samples],
        [sample["ms"] for sample in samples],
        ".",
        markersize=3,
        label="append latency (ms)",
    )
    wave.set_xlabel("seconds since the compactions were enqueued (first wave)")
    wave.set_ylabel("ms per append (a few slowest off the scale)")
    ordered = sorted(sample["ms"] for sample in samples)
    wave.set_ylim(0, 1.3 * ordered[int(0.995 * (len(ordered) - 1))])
    wave.grid(alpha=0.3)
    flight = wave.twinx()
    flight.step(
        [sample["at"] for sample in samples],
        [sample["after"][0] for sample in samples],
        where="post",
        color="#d62728",
        label="leases held (compactions in flight)",
    )
    flight.set_ylabel("compactions in flight")
    flight.set_ylim(0, report["workers"] + 1)
    handles = wave.get_legend_handles_labels()[0] + flight.get_legend_handles_labels()[0]
    wave.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper left")
    values = [
        [sample["ms"] for sample in report["phases"][name]["samples"]] for name in BACKGROUND_PHASES
    ]
    boxes.boxplot(values, whis=(5, 95), showfliers=False)
    boxes.set_xticks(range(1, len(values) + 1), list(BACKGROUND_PHASES.values()), fontsize=8)
    boxes.set_ylabel("ms per append (box: quartiles; whiskers: p5 to p95)")
    boxes.grid(alpha=0.3, axis="y")
    figure.suptitle(
        f"An append's latency while {report['workers']} compactions run on "
        f"{report['workers']} db_worker processes (summarizer: {report['summarizer_seconds']:g} s)"
    )
    figure.tight_layout()
    return _save(figure, plt, path)
