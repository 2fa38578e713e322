"""Draw a simulated schedule: a time-aligned text grid, or a Gantt chart PNG."""

from __future__ import annotations

from .simulate import Timeline

COLOURS = {"F": "#4C72B0", "B": "#55A868", "I": "#8FBF5A", "W": "#C9A227",
           "SEND_F": "#BBBBBB", "RECV_F": "#BBBBBB", "SEND_B": "#999999", "RECV_B": "#999999"}


def text_grid(timeline: Timeline, unit: float = 1.0) -> str:
    """One row per rank, one column per ``unit`` of time: the action that starts there, '-' while it
    continues, '.' idle. Zero-length actions (sends, receives) are left out."""
    slots = int(round(timeline.makespan / unit))
    width = max((len(str(a)) for row in timeline.events for a, s, e in row if e > s), default=2)
    lines = []
    for r, row in enumerate(timeline.events):
        cells = ["." * 1] * slots
        for a, start, end in row:
            first, last = int(round(start / unit)), int(round(end / unit))
            if last > first:
                cells[first] = str(a)
                for k in range(first + 1, last):
                    cells[k] = "-"
        lines.append(f"rank {r}: " + " ".join(c.rjust(width) for c in cells))
    return "\n".join(lines)


def metrics_text(timeline: Timeline) -> str:
    return (f"makespan {timeline.makespan:g}, bubble {timeline.bubble_fraction:.4f}, "
            f"idle within each rank's span {[round(x, 6) for x in timeline.idle_within]}, "
            f"peak stage activations per rank {timeline.peak_in_flight}")


def gantt_png(timeline: Timeline, path, title: str = "") -> None:
    """A Gantt chart: a row per rank, a box per action coloured by kind, microbatch number inside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = len(timeline.events)
    fig, ax = plt.subplots(figsize=(max(6.0, timeline.makespan * 0.35), 0.6 * ranks + 1.2))
    for r, row in enumerate(timeline.events):
        for a, start, end in row:
            if end <= start:
                continue
            ax.broken_barh([(start, end - start)], (r - 0.4, 0.8), facecolors=COLOURS[a.kind], edgecolor="white")
            ax.text((start + end) / 2, r, f"{a.kind}{a.microbatch}", ha="center", va="center", fontsize=7,
                    color="white")
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.invert_yaxis()
    ax.set_xlim(0, timeline.makespan)
    ax.set_xlabel("time")
    ax.set_title(title or metrics_text(timeline), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")  # at ``path`` as given (matplotlib appends ".png" to a bare name)
    plt.close(fig)
