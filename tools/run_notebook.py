"""Run every code cell of a notebook top to bottom, demos included, without Jupyter, and time it.

    python -m tools.run_notebook [--visible-only] solutions/02_activations.ipynb [...]

For machines without Jupyter (the lent GPU boxes) and for the course's own test that each solution
runs top to bottom. Plots go to matplotlib's Agg backend; cells are compiled as the grader's loader
compiles them (magics become `pass`, Triton kernels can read their source). --visible-only leaves out the check
cells' hidden tests, as the learner's notebook does (make test runs every case of every check elsewhere).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
import types

from memfit.notebook import cell_source, compile_cell, read_notebook, strip_magics


HIDDEN_TESTS = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS[^\n]*\n?", re.S | re.M)


def run(path: str, visible_only: bool = False) -> float:
    os.environ.setdefault("MPLBACKEND", "Agg")
    # A module with the notebook's path as __file__, as the grader's loader makes: classes defined in the
    # notebook can then be found by name from other processes (memfit.dist.importable_name).
    module = types.ModuleType("notebook_run")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    os.chdir(os.path.dirname(os.path.abspath(path)))  # where Jupyter runs a notebook: a cell may open its own file
    start = time.perf_counter()
    for i, cell in enumerate(read_notebook(path)["cells"], 1):
        if cell["cell_type"] != "code":
            continue
        source = cell_source(cell)
        if visible_only:
            source = HIDDEN_TESTS.sub("", source)
        exec(compile_cell(strip_magics(source), path, i), namespace)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+")
    parser.add_argument("--visible-only", action="store_true", help="leave out the hidden tests, as lessons/ does")
    args = parser.parse_args(argv)
    for path in map(os.path.abspath, args.notebooks):  # each run moves to its notebook's folder
        seconds = run(path, args.visible_only)
        print(f"{path}: ran top to bottom in {seconds:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
