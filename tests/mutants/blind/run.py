"""Run the blind set through the checks as the grader runs them (cases="all", MEMFIT_GRADING=1), in process.

    python -m tests.mutants.blind.run [LESSON ...] [--json FILE]

prints, per lesson, each entry's outcome: a wrong entry "rejected" (CheckFailed, an error or a timeout: the
points are lost) or "SLIPPED" (it kept the points); a right entry "kept" or "REJECTED"; GPU-only checks "skipped"
on a machine without one. tests/test_blind_mutants.py asserts every wrong entry is rejected and every right one
kept.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import time

from autograder.checks import CheckFailed, CheckSkipped, checks_for
from tests.mutants.registry import LESSONS, REF, as_mapping

_references: dict = {}


def blind_module(lesson: str):
    return importlib.import_module(f"tests.mutants.blind.{lesson.split('_', 1)[1]}")


def reference(lesson: str):
    if lesson not in _references:
        from autograder.notebook_loader import load_solution
        _references[lesson] = load_solution(lesson)
    return _references[lesson]


def entries(lesson: str):
    """(check, verdict, entry) for every entry of the lesson's BLIND table."""
    module = blind_module(lesson)
    checks = {c.name: c for c in checks_for(lesson)}
    for name, table in module.BLIND.items():
        for verdict in ("wrong", "right"):
            for entry in table.get(verdict, []):
                yield checks[name], verdict, entry


def label(entry) -> str:
    if isinstance(entry, str):
        return entry
    return "+".join(v for v in entry.values() if v != REF)


@contextlib.contextmanager
def _time_limit(seconds: float):
    def expire(*_):
        raise TimeoutError(f"ran past {seconds:.0f} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_entry(lesson: str, check, entry) -> tuple[str, str]:
    """(outcome, message): outcome is passed, failed, error, timeout or skipped."""
    module = blind_module(lesson)
    mapping = as_mapping(entry, check.uses)
    fns = [getattr(reference(lesson), fn) if value == REF else getattr(module, value)
           for fn, value in mapping.items()]
    try:
        with _time_limit(check.timeout_s):
            check.run(*fns, cases="all")
    except CheckSkipped as exc:
        return "skipped", str(exc)
    except CheckFailed as exc:
        return "failed", str(exc)
    except TimeoutError as exc:
        return "timeout", str(exc)
    except Exception as exc:  # the grader records an error row: no points
        return "error", f"{type(exc).__name__}: {exc}"
    return "passed", ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lessons", nargs="*", default=list(LESSONS))
    parser.add_argument("--json", help="write every outcome to this file")
    args = parser.parse_args()
    os.environ["MEMFIT_GRADING"] = "1"  # skip() raises CheckSkipped, as under the grader
    rows = []
    for lesson in args.lessons:
        for check, verdict, entry in entries(lesson):
            start = time.perf_counter()
            outcome, message = run_entry(lesson, check, entry)
            seconds = time.perf_counter() - start
            bad = (verdict == "wrong" and outcome == "passed") or (verdict == "right" and outcome not in ("passed", "skipped"))
            rows.append(dict(lesson=lesson, check=check.name, verdict=verdict, entry=label(entry), outcome=outcome,
                             message=message[:300], seconds=round(seconds, 1), bad=bad))
            shown = {"wrong": {"passed": "SLIPPED"}, "right": {"passed": "kept"}}[verdict].get(
                outcome, "skipped" if outcome == "skipped" else ("rejected" if verdict == "wrong" else "REJECTED"))
            print(f"{lesson:20s} {check.name:26s} {verdict:5s} {label(entry):45s} {shown:9s} {seconds:6.1f}s "
                  f"{message[:110]}", flush=True)
    for lesson in args.lessons:
        mine = [r for r in rows if r["lesson"] == lesson]
        wrong = [r for r in mine if r["verdict"] == "wrong" and r["outcome"] != "skipped"]
        right = [r for r in mine if r["verdict"] == "right" and r["outcome"] != "skipped"]
        print(f"{lesson}: {sum(r['bad'] for r in wrong)} of {len(wrong)} wrong entries slipped; "
              f"{sum(r['bad'] for r in right)} of {len(right)} right entries rejected; "
              f"{sum(r['outcome'] == 'skipped' for r in mine)} skipped (need a GPU)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
