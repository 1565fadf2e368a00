"""The fairness figure: every grant of experiment 3 at its largest process
count, wait over time, one colour per process, pathlock beside the naive
algorithm.
Needs matplotlib (``pip install 'pathlock[bench]'``); without it the suite
runs all the same and says the plot was skipped."""

from __future__ import annotations

from pathlib import Path

from pathlock.bench.report import Trace

INSTALL_HINT = "pip install 'pathlock[bench]'"


def plot_fairness(trace: Trace, path: Path, *, processes: int, hold: float) -> str | None:
    """Write the figure to ``path`` (PNG); ``None``, or why it was skipped."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError:  # an optional extra: everything else runs without it
        return f"matplotlib is not installed ({INSTALL_HINT})"
    figure = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(figure)  # the Agg backend, without pyplot's global state
    axes = figure.subplots(1, len(trace), sharey=True, squeeze=False)[0]
    for ax, (algorithm, grants) in zip(axes, trace.items(), strict=True):
        for process in sorted({grant[0] for grant in grants}):
            mine = [grant for grant in grants if grant[0] == process]
            ax.scatter(
                [at for _, at, _ in mine],
                [wait * 1000 for _, _, wait in mine],
                s=7,
                color=f"C{process}",
                label=f"process {process + 1}",
            )
        ax.set_title(f"{algorithm}: {len(grants):,} grants")
        ax.set_xlabel("time since the round began (s)")
        ax.set_yscale("log")
        ax.grid(visible=True, which="both", alpha=0.3)
    axes[0].set_ylabel("wait from request to grant (ms)")
    axes[0].legend(loc="upper left", fontsize="small", markerscale=2)
    figure.suptitle(
        f"{processes} processes take one path in turn (hold {hold * 1000:g} ms): "
        "the wait of every grant"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return None
