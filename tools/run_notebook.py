"""Run every code cell of a notebook top to bottom, demos included, without Jupyter, and time it.

    python -m tools.run_notebook solutions/02_activations.ipynb [...]

For machines without Jupyter (the lent GPU boxes) and for the course's own test that each solution
runs within its time budget. Plots go to matplotlib's Agg backend; magics are skipped.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from autograder.notebook_loader import read_notebook


def run(path: str) -> float:
    os.environ.setdefault("MPLBACKEND", "Agg")
    namespace = {"__name__": "__main__"}
    start = time.perf_counter()
    for i, cell in enumerate(read_notebook(path)["cells"], 1):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        source = "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
        exec(compile(source, f"{path}:cell {i}", "exec"), namespace)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+")
    args = parser.parse_args(argv)
    for path in args.notebooks:
        seconds = run(path)
        print(f"{path}: ran top to bottom in {seconds:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
