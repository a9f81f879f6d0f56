"""Lesson 06: the checks pass the reference and report stubs as not implemented (the registry's mutants and
alternatives run in tests/test_registry_entries.py)."""
import pytest

from course import ROOT
from autograder.checks import NotImplementedYet
from autograder.checks import fused_linear_ce as checks
from course.notebook_loader import load_notebook, load_solution

ref = load_solution("06_fused_linear_ce")

# (check, the name of the lesson's function it takes)
CHECKS = [(checks.check_cross_entropy_with_grad, "cross_entropy_with_grad"),
          (checks.check_chunked_linear_ce, "chunked_linear_ce"),
          (checks.check_fused_linear_ce_forward, "fused_linear_ce_forward"),
          (checks.check_fused_linear_ce_memory, "fused_linear_ce_forward"),
          (checks.check_fused_linear_cross_entropy, "fused_linear_cross_entropy")]


@pytest.mark.parametrize("check, name", CHECKS, ids=[check.__name__ for check, _ in CHECKS])
def test_reference_passes_every_case(check, name):
    check(getattr(ref, name), cases="all")


def test_stubs_are_reported_not_implemented():
    stub = load_notebook(ROOT / "lessons" / "06_fused_linear_ce.ipynb").module
    for check, name in CHECKS:
        with pytest.raises(NotImplementedYet):
            check(getattr(stub, name))
