"""A learner's first run of each solution notebook: top to bottom in a real Jupyter kernel, every cell timed.

    python -m benchmarks.notebook_times [LESSON ...] [--out benchmarks/results] [--warm]

Each notebook runs through nbclient (the kernel JupyterLab starts), in solutions/, with empty Triton and
TorchInductor caches (what a learner's first run compiles), unless --warm. Writes <device>-<date>-notebooks.json
and .md under --out: each notebook's total, its slowest cell, and every cell over the course's budget. The budget
the course holds itself to on a 2-core CPU: 2 minutes a notebook, 30 s a cell. Measure with nothing else running.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

from course import ROOT, course_env
from course.lessons import lessons, solution_path

NOTEBOOK_BUDGET_S = 120.0
CELL_BUDGET_S = 30.0


def machine() -> dict:
    import torch
    import triton
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
    else:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
        device = f"CPU, {os.cpu_count()} cores ({model})"
    return dict(device=device, torch=torch.__version__, triton=triton.__version__, python=platform.python_version())


def first_line(source: str) -> str:
    lines = [line for line in source.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return (lines[0][:70] if lines else "").strip()


def time_notebook(path: Path, warm: bool) -> dict:
    """Run every cell in a fresh kernel; return the total and each code cell's seconds."""
    import nbclient
    import nbformat
    nb = nbformat.read(path, as_version=4)
    cells = []
    started = {}

    def on_start(cell, cell_index, **_):
        started[cell_index] = time.perf_counter()

    def on_done(cell, cell_index, **_):
        cells.append(dict(cell=cell_index + 1, seconds=round(time.perf_counter() - started[cell_index], 2),
                          first_line=first_line(cell.source)))

    with tempfile.TemporaryDirectory() as caches:
        env = course_env(MPLBACKEND="Agg")
        if not warm:
            env.update(TRITON_CACHE_DIR=f"{caches}/triton", TORCHINDUCTOR_CACHE_DIR=f"{caches}/inductor")
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)  # the kernel inherits this process's environment
        try:
            client = nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3",
                                             resources={"metadata": {"path": str(path.parent)}},
                                             on_cell_execute=on_start, on_cell_executed=on_done)
            start = time.perf_counter()
            client.execute()
            total = time.perf_counter() - start
        finally:
            os.environ.clear()
            os.environ.update(saved)
    slowest = max(cells, key=lambda c: c["seconds"]) if cells else None
    return dict(notebook=f"{path.parent.name}/{path.name}", seconds=round(total, 1), cells=cells, slowest=slowest,
                over_cell_budget=[c for c in cells if c["seconds"] > CELL_BUDGET_S])


def markdown(result: dict) -> str:
    rows = ["| notebook | top to bottom | slowest cell | cells over 30 s |", "| --- | --- | --- | --- |"]
    for r in result["notebooks"]:
        s = r["slowest"]
        over = ", ".join(f"{c['cell']} ({c['seconds']:.0f} s)" for c in r["over_cell_budget"]) or "none"
        flag = "" if r["seconds"] <= NOTEBOOK_BUDGET_S else " (over 2 min)"
        rows.append(f"| {r['notebook']} | {r['seconds']:.1f} s{flag} | cell {s['cell']}: {s['seconds']:.1f} s "
                    f"(`{s['first_line']}`) | {over} |")
    caches = "warm Triton and TorchInductor caches" if result["warm"] else "empty Triton and TorchInductor caches (a first run)"
    return (f"# Solution notebooks top to bottom, {result['date']}\n\n{result['device']}; torch {result['torch']}, "
            f"triton {result['triton']}, Python {result['python']}; a Jupyter kernel (nbclient), {caches}, "
            f"one notebook at a time.\n\n`python -m benchmarks.notebook_times{' --warm' if result['warm'] else ''}`\n\n"
            + "\n".join(rows) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lessons", nargs="*", help="e.g. 04_kernel_fusion (default: every solution notebook)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--warm", action="store_true", help="keep this machine's compiler caches")
    args = parser.parse_args(argv)
    paths = [solution_path(lesson) for lesson in lessons()]
    if args.lessons:
        paths = [p for p in paths if any(p.stem.startswith(l) for l in args.lessons)]
        if not paths:
            parser.error(f"no solution notebook matches {args.lessons}")
    facts = machine()
    date = datetime.date.today().isoformat()
    result = dict(date=date, warm=args.warm, **facts, notebooks=[])
    for path in paths:
        r = time_notebook(path, args.warm)
        result["notebooks"].append(r)
        print(f"{r['notebook']}: {r['seconds']:.1f} s, slowest cell {r['slowest']['cell']} "
              f"({r['slowest']['seconds']:.1f} s)", file=sys.stderr, flush=True)
    slug = "cpu" if facts["device"].startswith("CPU") else re.sub(r"[^a-z0-9]+", "-", facts["device"].lower()).strip("-")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{slug}-{date}-notebooks{'-warm' if args.warm else ''}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
