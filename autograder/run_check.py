"""Child process of the grader: load one notebook, run one check, write its result as JSON.

    python -m autograder.run_check NOTEBOOK CHECK RESULT_JSON

Run in its own process so that a crash, a hang, os._exit or an out-of-memory in learner code
ends only this check. The parent reads RESULT_JSON; if the file is missing, the process died.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

os.environ["MEMFIT_GRADING"] = "1"  # a skipped check raises instead of printing (autograder.checks.skip)

import memfit  # noqa: E402,F401  (decides TRITON_INTERPRET before any notebook imports triton)
from autograder.checks import (  # noqa: E402
    CheckFailed, CheckSkipped, LearnerCodeError, NotImplementedYet, checks_for)
from autograder.notebook_loader import load_notebook  # noqa: E402


def run(notebook: str, check_name: str) -> dict:
    started = time.perf_counter()
    loaded = load_notebook(notebook, cell_timeout_s=float(os.environ.get("MEMFIT_CELL_TIMEOUT_S", 60)))
    check = {c.name: c for c in checks_for(loaded.lesson)}[check_name]
    missing = [name for name in check.uses if not callable(getattr(loaded.module, name, None))]
    if missing:
        broken = "; ".join(map(str, loaded.errors))
        return dict(status="error", message=(
            f"the notebook defines no function {', '.join(missing)}: was its cell deleted, renamed or broken?"
            + (f" Cells that failed to run: {broken}" if broken else "")))
    functions = [getattr(loaded.module, name) for name in check.uses]
    try:
        check.run(*functions, cases="all")
    except CheckSkipped as exc:
        return dict(status="skipped", message=str(exc))
    except NotImplementedYet as exc:
        return dict(status="failed", message=str(exc))
    except LearnerCodeError as exc:
        return dict(status="error", message=str(exc))
    except CheckFailed as exc:
        return dict(status="failed", message=str(exc))
    except BaseException as exc:  # noqa: BLE001  (SystemExit, KeyboardInterrupt from learner code too)
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return dict(status="error", message=f"the check stopped with {last}")
    return dict(status="passed", message=f"passed in {time.perf_counter() - started:.1f} s")


def main(argv: list[str]) -> int:
    notebook, check_name, result_path = argv
    try:
        result = run(notebook, check_name)
    except Exception as exc:  # noqa: BLE001  (a fault of the grader, not of the notebook: say so)
        result = dict(status="error", message=f"grader error, please report it: {''.join(traceback.format_exception_only(type(exc), exc)).strip()}")
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
