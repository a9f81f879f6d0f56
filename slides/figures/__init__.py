"""What a deck shows: slides/figures/<deck>.py, the deck's companion, is the namespace of its {{ expressions }} and
gives fig_NAME() (a matplotlib Figure for fig:NAME). Both compute from the course's own code (memfit,
memfit.from_lessons: the lessons' reference solutions) or read a recorded run under benchmarks/results/ through
record(); nothing is typed in. The chart helpers (stacked, lanes, arrow, canvas) draw the shapes several decks share.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.patches as patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"

# One look for every deck's charts: large type for a projector, the course's four colours.
COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868", "activations": "#C44E52",
          "ours": "#8172B3", "peer": "#937860", "neutral": "#8C8C8C"}
STYLE = {"figure.figsize": (8.0, 4.2), "font.size": 15, "axes.titlesize": 16, "axes.labelsize": 15,
         "legend.fontsize": 13, "xtick.labelsize": 13, "ytick.labelsize": 13, "axes.spines.top": False,
         "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3, "svg.hashsalt": "memfit",
         "svg.fonttype": "path"}


def figure(**kwargs):
    """plt.subplots in the decks' style: fig, ax (or axes)."""
    with plt.rc_context(STYLE):
        return plt.subplots(**kwargs)


def canvas(**kwargs):
    """figure() for a diagram: no axes, no grid."""
    fig, ax = figure(**kwargs)
    ax.grid(False)
    ax.axis("off")
    return fig, ax


def limit(ax, value: float, text: str, xy: tuple, vertical: bool = True, color: str = COLORS["activations"],
          ls: str = "--", lw: float | None = None, **text_kwargs):
    """A line at a limit (a card's memory, a ceiling), vertical or horizontal, with its label at xy in its colour."""
    width = {} if lw is None else {"lw": lw}
    (ax.axvline if vertical else ax.axhline)(value, color=color, ls=ls, **width)
    ax.text(*xy, text, color=color, **text_kwargs)


def arrow(ax, tail, head, color="#333", lw=2, style="-|>", **props):
    """An arrow from tail to head, in data coordinates."""
    ax.annotate("", xy=head, xytext=tail, arrowprops=dict(arrowstyle=style, lw=lw, color=color, **props))


def lanes(ax, colors: list[str], n: int, fontsize: float, lw: float | None = None, pad: str | None = None,
          first: int = 0):
    """A row of cells first, first + 1, ... in the given colors (one per cell): those from n on are padding or
    masked lanes, white and hatched, labelled `pad` (their index if None)."""
    for i, color in enumerate(colors, start=first):
        inside = i < n
        ax.add_patch(patches.Rectangle((i, 0), 0.92, 1, facecolor=color if inside else "white", edgecolor=color,
                                       hatch=None if inside else "//", alpha=0.85 if inside else 1, lw=lw))
        ax.text(i + 0.46, 0.5, str(i) if inside or pad is None else pad, ha="center", va="center",
                fontsize=fontsize, color="white" if inside else color)


def stacked(ax, at, parts, horizontal: bool = False, **kwargs) -> list[float]:
    """Bars at `at`, stacked from parts = [(values, color, label)], the first at the bottom (left); the totals."""
    base = [0.0] * len(at)
    for values, color, label in parts:
        if horizontal:
            ax.barh(at, values, left=base, color=color, label=label, **kwargs)
        else:
            ax.bar(at, values, bottom=base, color=color, label=label, **kwargs)
        base = [b + v for b, v in zip(base, values)]
    return base


@functools.cache
def record(name: str, file: str = "") -> dict:
    """The newest recorded run under benchmarks/results/ that holds lesson benchmark `name` (e.g. "first_kernel"),
    with the run's device facts merged in: {"device", "torch", "triton", "date", "path", name: {...}}.
    file: only records whose file name contains this (e.g. "h100", "sweep"), when several runs hold `name`."""
    found = []
    for path in sorted(p for p in RESULTS.glob("*.json") if file in p.name):
        data = json.loads(path.read_text())
        body = data.get(name, data.get("lessons", {}).get(name))
        if body is not None:
            found.append((data.get("date", ""), path.name, data, body))
    if not found:
        raise FileNotFoundError(f"no record under benchmarks/results/ holds {name!r}"
                                f"{f' in a file named *{file}*' if file else ''}: run `python -m benchmarks.{name}` "
                                f"on a GPU (make bench) to record one")
    date, filename, data, body = max(found, key=lambda f: (f[0], f[1]))
    run = {k: v for k, v in data.items() if not isinstance(v, dict)}
    return {**run, "path": f"benchmarks/results/{filename}", name: body}


def log_record(key: str) -> dict:
    """A text log's facts, read by key from its JSON companion (python -m slides.log_records), with the run's device,
    versions and date, and the log's path."""
    rec = record(key)
    run = {k: rec[k] for k in ("device", "torch", "triton", "date") if k in rec}
    return {**rec[key], **run, "path": rec["log"]}


def source(rec: dict) -> str:
    """The line under a measured figure: device, versions, date and the record's path (a text log's JSON companion
    names the log it was read from: python -m slides.log_records)."""
    where = rec.get("log", rec["path"])
    return f"{rec['device']}, torch {rec['torch']}, triton {rec['triton']}, {rec['date']}: {where}"


def gib(n_bytes: float, digits: int = 1) -> str:
    return f"{n_bytes / 2**30:,.{digits}f} GiB"


def kib(n_bytes: float, digits: int = 0) -> str:
    return f"{n_bytes / 2**10:,.{digits}f} KiB"


def mib(n_bytes: float, digits: int = 1) -> str:
    return f"{n_bytes / 2**20:,.{digits}f} MiB"


def pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%"


def dtype_name(dtype) -> str:
    """torch.bfloat16 -> bf16, "float32" -> fp32: the short names the slides use."""
    return str(dtype).replace("torch.", "").replace("bfloat", "bf").replace("float", "fp")


def gb(n_bytes: float, digits: int = 1) -> str:
    return f"{n_bytes / 1e9:,.{digits}f} GB"


@functools.cache
def lesson(name: str):
    """A lesson's reference solution as a module, loaded from solutions/<name>.ipynb (graded cells only, no demos):
    the deck runs the very code the lesson teaches."""
    from course.notebook_loader import load_solution
    return load_solution(name)


def measured_on() -> str:
    """Where make slides ran, for numbers it measures itself (the memory meter on this machine)."""
    import memfit
    import torch
    prof = memfit.profile()
    where = prof.gpu_name if prof.is_gpu else "a CPU (live-tensor meter, Triton interpreter)"
    return f"measured by make slides on {where}, torch {torch.__version__}"


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
