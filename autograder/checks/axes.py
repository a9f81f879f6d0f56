"""What an exercise's text lets vary, listed beside a check's cases, and the proof that every value has a case.

A lesson's check module declares, next to its cases:

    AXES = {check name: {axis: (value, ...)}}
        every value of every axis the exercise's text allows that needs a case of its own: ranks, strides and
        views, dtypes, each option and its values, sizes against blocks, tiles, chunks and world sizes,
        magnitudes, edge values, the call paths memory is measured on;

    def case_axes(check: str, cases: str) -> list[dict]
        the cases the check runs under `cases` ("visible" or "hidden"), each as {axis: value}, or
        {axis: (value, ...)} for a case that covers several values of one axis. It is computed from the very
        plan the check iterates over, so it cannot say more than the check does.

tests/test_check_axes.py fails when a value has no visible case or no hidden case: a learner who passes the
visible cases meets no new kind of input at grading time, and the hidden cases differ in values and sizes only.
"""
from __future__ import annotations

import importlib
from typing import Iterable

from autograder.checks import checks_for
from course.lessons import checks_module, topic


def values_of(case_value) -> tuple:
    """A case's value for an axis: one value, or a tuple/list/set of the values it covers."""
    return tuple(case_value) if isinstance(case_value, (tuple, list, set, frozenset)) else (case_value,)


def uncovered(axes: dict[str, Iterable], cases: list[dict]) -> list[str]:
    """'axis=value' for each value of `axes` that no case covers, and 'axis (unknown)' for an axis a case
    names that `axes` does not list (a misspelt axis would otherwise cover nothing and go unnoticed)."""
    missing = []
    for case in cases:
        missing += [f"{axis} (not in AXES)" for axis in case if axis not in axes]
    for axis, values in axes.items():
        seen = {v for case in cases if axis in case for v in values_of(case[axis])}
        missing += [f"{axis}={value!r}" for value in values if value not in seen]
    return sorted(set(missing))


def lesson_axes(lesson: str):
    """(AXES, case_axes) of a lesson's check module; AttributeError names what it lacks."""
    module = importlib.import_module(checks_module(lesson))
    for name in ("AXES", "case_axes"):
        if not hasattr(module, name):
            raise AttributeError(f"autograder/checks/{topic(lesson)}.py defines no {name}")
    return module.AXES, module.case_axes


def coverage_gaps(lesson: str) -> dict[str, list[str]]:
    """{'check (visible)': [uncovered values], ...} for every check of the lesson; empty when all is covered."""
    axes, case_axes = lesson_axes(lesson)
    gaps = {}
    for check in checks_for(lesson):
        if check.name not in axes:
            gaps[check.name] = ["no AXES entry"]
            continue
        if not axes[check.name]:
            gaps[check.name] = ["AXES lists no axis"]
            continue
        for cases in ("visible", "hidden"):
            missing = uncovered(axes[check.name], case_axes(check.name, cases))
            if missing:
                gaps[f"{check.name} ({cases})"] = missing
    return gaps
