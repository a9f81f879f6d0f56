"""Reference values that are the same for every student, computed once when a class is graded.

Some checks spend most of their time on the grader's side: predict_peak measures 42 training steps of the
course trainer, adamw8bit_convergence trains course-tiny with torch's AdamW for 200 steps. Those values depend
only on the grader's inputs, so a check asks for them by a key:

    measured = reference(f"predict_peak {cfg!r} ...", lambda: measure_step(...))

Grading a class, the runner first computes them in a trusted process that loads no notebook
(`python -m autograder.checks.references LESSON FILE`: the checks marked `references=True`, run on the lesson's
reference code, with every value they ask for recorded) and saves them in the grades folder. Each student's
child loads that file before its guards go up; the guards keep the notebook from opening it, and a notebook that
changes global state (random seeds, default dtype) cannot change another student's references. Without a file (the
notebook's own test cells, the tests, a check run by hand) the value is computed in place, as before.
"""
from __future__ import annotations

import copy
import pickle
import sys
from pathlib import Path
from typing import Any, Callable

# Imported with this module, before the grading child's file guard goes up: a lazy import here, when a check first
# asks for a value, would read the grader's file while graded code runs (and be refused).
from autograder.checks.numerics import current_draw
from course.lessons import topic

_VALUES: dict[str, Any] = {}
_recording = False


def reference(key: str, compute: Callable[[], Any]) -> Any:
    """The value for `key`: loaded, or computed now (and kept when recording). A copy, so a check may change it.
    Another draw of the cases' random values (tests/test_draws.py) keys its values apart from the grader's."""
    if current_draw():
        key = f"{key} (draw {current_draw()})"
    if key in _VALUES:
        return copy.deepcopy(_VALUES[key])
    value = compute()
    if _recording:
        _VALUES[key] = copy.deepcopy(value)
    return value


def keep_computed(keep: bool = True) -> bool:
    """Keep every value computed in place from now on, for the rest of this process, as `record` does (the test
    workers do: many tests grade a right or wrong entry of the same check, and the values do not depend on it).
    Returns whether values were kept before, to put back."""
    global _recording
    before, _recording = _recording, keep
    return before


def load(path: str | Path) -> int:
    """Load the values a trusted process saved (before the notebook runs); returns how many."""
    with open(path, "rb") as f:
        values = pickle.load(f)
    if not isinstance(values, dict):
        raise ValueError(f"{path}: not a file of reference values")
    _VALUES.update(values)
    return len(values)


def record(lesson: str, path: str | Path) -> int:
    """Run the lesson's checks marked references=True on its reference code; save every value they asked for."""
    from autograder.checks import checks_for
    reference_code = __import__(f"memfit.from_lessons.{topic(lesson)}", fromlist=["*"])
    kept = keep_computed(True)
    try:
        for check in checks_for(lesson):
            if check.references:
                check.run(*[getattr(reference_code, name) for name in check.uses], cases="all")
    finally:
        keep_computed(kept)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(_VALUES, f)
    tmp.replace(path)  # whole or absent: a child never reads half a file
    return len(_VALUES)


def lessons_with_references(lessons) -> list[str]:
    from autograder.checks import checks_for
    return [lesson for lesson in lessons if any(c.references for c in checks_for(lesson))]


if __name__ == "__main__":
    import os
    os.environ.setdefault("MEMFIT_GRADING", "1")
    import memfit  # noqa: F401  (decides TRITON_INTERPRET before the reference code imports triton)
    from autograder import sandbox
    from memfit.runtime import cpu_share
    sandbox.limit_threads(int(os.environ.get("MEMFIT_THREADS", "0")) or cpu_share())
    sandbox.fill_uninitialized_memory()  # as in the grading child, so that a value measured here equals one measured there
    from autograder.checks import references  # the module the checks import, not this __main__ copy of it
    print(f"{sys.argv[1]}: {references.record(sys.argv[1], sys.argv[2])} reference values saved")
