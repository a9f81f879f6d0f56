"""Every check lists the axes its exercise's text allows (AXES, beside its cases) and covers each value with a
visible case and a hidden case (case_axes, computed from the plan the check runs). Nothing here runs a check."""
import pytest

from autograder.checks.axes import coverage_gaps, uncovered
from tests.mutants.registry import LESSONS


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_axis_value_has_a_visible_and_a_hidden_case(lesson):
    gaps = coverage_gaps(lesson)
    assert not gaps, "values with no case:\n" + "\n".join(f"  {check}: {', '.join(v)}" for check, v in gaps.items())


def test_a_value_without_a_case_is_reported():
    axes = {"dtype": ("float32", "float16"), "out": ("given", "None")}
    cases = [{"dtype": "float32", "out": ("given", "None")}]
    assert uncovered(axes, cases) == ["dtype='float16'"]
    assert uncovered(axes, cases + [{"dtype": "float16"}]) == []
    assert uncovered(axes, [{"dtpye": "float32"}]) == sorted(["dtpye (not in AXES)", "dtype='float32'",
                                                               "dtype='float16'", "out='given'", "out='None'"])
