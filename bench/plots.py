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
