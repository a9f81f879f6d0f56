"""The blind set (tests/mutants/blind/): wrong implementations written from the exercise text alone lose their
check's points, right alternatives keep them, run as the grader runs each check (cases="all")."""
import pytest

from tests.mutants.blind.run import entries, run_entry
from tests.mutants.registry import LESSONS, label

CASES = [(lesson, check, verdict, entry) for lesson in LESSONS for check, verdict, entry in entries(lesson)]


@pytest.mark.parametrize("lesson, check, verdict, entry", CASES,
                         ids=[f"{lesson[:2]}-{check.name}-{verdict}-{label(entry)}" for lesson, check, verdict, entry in CASES])
def test_blind_entry(lesson, check, verdict, entry, monkeypatch):
    monkeypatch.setenv("MEMFIT_GRADING", "1")
    outcome, message = run_entry(lesson, check, entry, slack=4.0)  # a hang still ends; slowness fails nothing
    if outcome == "skipped":
        pytest.skip(message)
    if verdict == "wrong":
        assert outcome != "passed", f"{label(entry)} kept the points of {check.name}"
    else:
        assert outcome == "passed", f"{label(entry)} lost the points of {check.name}: {outcome}: {message}"
