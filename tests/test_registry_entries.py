"""Every entry of tests/mutants/registry.py, run through its check as the grader runs it: check.run(*functions,
cases="all") under MEMFIT_GRADING=1. A wrong entry loses the check's points with the exception and message the
registry names (and, marked visible, loses them on the visible cases alone); a right one keeps them. The cases of a
lesson share one pytest-xdist worker, so the reference values they ask for (autograder.checks.references, kept by
tests/conftest.py) are computed once."""
from __future__ import annotations

import importlib
import re

import pytest
import torch

from autograder.checks import CheckSkipped, checks_for
from tests.mutants.registry import LESSONS, REGISTRY, Right, Wrong, functions_of, label, mutant_module


# The entries run on other cases than the grader's "all", each for its reason.
CASES_INSTEAD_OF_ALL = {
    # The grader's run trains 200 steps with the entry and 200 with torch's AdamW (90 s on 2 cores); the visible run
    # trains the same first 60 (same seeds, no schedule) and the check fails at its first 20-step window in both.
    "07_quantization/adamw8bit_convergence/wrong/adam_no_bias_correction": "visible",
}


def registry_cases(visible_only: bool = False):
    """One pytest.param per (lesson, check, entry), with an id lesson/check/verdict/mutants (only the wrong entries
    marked visible, with visible_only)."""
    for lesson in LESSONS:
        for check in checks_for(lesson):
            for verdict in ("wrong", "right"):
                for entry in REGISTRY[lesson][check.name][verdict]:
                    if visible_only and not getattr(entry, "visible", False):
                        continue
                    yield pytest.param(lesson, check, entry, id=f"{lesson}/{check.name}/{verdict}/{label(entry)}",
                                       marks=pytest.mark.xdist_group(f"registry_{lesson}"))


def mutants_given(lesson: str, check, entry) -> list:
    return functions_of(lesson, check, entry, importlib.import_module(mutant_module(lesson)))


def run_as_graded(check, functions, cases: str) -> None:
    """check.run as the grader calls it; a check this machine cannot run skips with its reason."""
    if check.needs_gpu and not torch.cuda.is_available():
        pytest.skip("skipped: needs a GPU")
    try:
        check.run(*functions, cases=cases)
    except CheckSkipped as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("lesson, check, entry", list(registry_cases()))
def test_registry_entry(lesson, check, entry, monkeypatch, request):
    monkeypatch.setenv("MEMFIT_GRADING", "1")  # as under the grader: a check that cannot run raises CheckSkipped
    functions = mutants_given(lesson, check, entry)
    if isinstance(entry, Right):
        run_as_graded(check, functions, entry.cases)
        return
    assert isinstance(entry, Wrong), entry
    assert_rejected(check, functions, entry, CASES_INSTEAD_OF_ALL.get(request.node.callspec.id, "all"))


@pytest.mark.parametrize("lesson, check, entry", list(registry_cases(visible_only=True)))
def test_visible_cases_reject_the_entry(lesson, check, entry, monkeypatch):
    monkeypatch.setenv("MEMFIT_GRADING", "1")
    assert_rejected(check, mutants_given(lesson, check, entry), entry, "visible")


def assert_rejected(check, functions, entry: Wrong, cases: str) -> None:
    """The check raises entry.raises itself (a subclass, such as NotImplementedYet, would be another verdict) with
    entry.message in its message."""
    with pytest.raises(entry.raises) as raised:
        run_as_graded(check, functions, cases)
    assert type(raised.value) is entry.raises, f"raised {type(raised.value).__name__}, not {entry.raises.__name__}"
    assert re.search(entry.message, str(raised.value)), f"{entry.message!r} is not in the message: {raised.value}"


def test_the_entries_run_on_other_cases_are_registered():
    ids = {param.id for param in registry_cases()}
    assert set(CASES_INSTEAD_OF_ALL) <= ids, set(CASES_INSTEAD_OF_ALL) - ids
