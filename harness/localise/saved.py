"""A localisation in the run folder: ``localised/<case>.json`` (its lines, the minimal case, the per-tensor curve)
and ``localised/<case>.png`` — every traced tensor in execution order, its worst error relative to its magnitude
against its bound (one device vs the layout), the first one off marked. The report's conformance section lists
them (``harness.cli.report``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from reference.files import atomic_write_text

FOLDER = "localised"


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")[:120] or "case"


def save(loc, directory, name: str) -> Path:
    """Write ``loc``'s JSON and plot under ``directory``/localised; returns the JSON's path."""
    folder = Path(directory) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    json_path, png_path = folder / f"{slug(name)}.json", folder / f"{slug(name)}.png"
    first = loc.first
    record = {"case": name, "lines": loc.lines(), "shape": loc.shape[0], "seconds": round(loc.seconds, 2),
              "calls": loc.shrunk.calls, "first": None if first is None else
              {"step": first.step, "phase": first.phase, "name": first.name, "rank": first.rank, "call": first.call,
               "error": first.rel, "bound": first.bound},
              "curve": [{"tensor": t, "error": e if e == e and e != float("inf") else None, "bound": b}
                        for t, e, b in loc.curve]}
    atomic_write_text(json_path, json.dumps(record, indent=1) + "\n")
    if loc.curve:
        plot(loc, png_path)
    return json_path


def plot(loc, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [t for t, _, _ in loc.curve]
    errors = [max(e, 1e-18) if e == e and e != float("inf") else 1e3 for _, e, _ in loc.curve]
    bounds = [b for _, _, b in loc.curve]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.12 * len(labels)), 4.0))
    xs = range(len(labels))
    ax.semilogy(xs, errors, ".-", label="|layout - one device| / magnitude (worst rank, call)")
    ax.semilogy(xs, bounds, "--", label="bound")
    if loc.first is not None:
        mark = f"{loc.first.step}:{loc.first.phase}:{loc.first.name}"
        if mark in labels:
            i = labels.index(mark)
            ax.axvline(i, color="red", alpha=0.4)
            ax.annotate("first off", (i, errors[i]), color="red")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=90, fontsize=5)
    ax.set_xlabel("traced tensors in execution order (step:phase:name)")
    ax.set_title(loc.shrunk.line()[:110], fontsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section(run_dir) -> list[str]:
    """The report's lines for the failing stack cases localised in ``run_dir``: each one's verdict lines and plot."""
    saved = sorted((Path(run_dir) / FOLDER).glob("*.json"))
    if not saved:
        return []
    out = ["### Where the failing stack cases diverge", "",
           "Each failing stack case shrunk to its minimal configuration and traced there on every rank against one "
           "device (`harness.localise`; docs/guides/when-a-stack-fails.md). The plot: every traced tensor in "
           "execution order, its worst error relative to its magnitude against its bound.", ""]
    for path in saved:
        record = json.loads(path.read_text())
        out += [f"**{record['case']}**", ""] + [f"- {line}" for line in record["lines"]]
        plot_path = path.parent / f"{path.stem}.png"
        out += (["", f"![{record['case']}]({FOLDER}/{plot_path.name})"] if plot_path.exists() else []) + [""]
    return out
