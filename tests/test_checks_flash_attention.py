"""Lesson 05: the checks pass the reference and report stubs as not implemented (the registry's mutants and
alternatives run in tests/test_registry_entries.py)."""
import pytest

from course import ROOT
from autograder.checks import NotImplementedYet
from autograder.checks import flash_attention as checks
from course.notebook_loader import load_notebook, load_solution

ref = load_solution("05_flash_attention")

# (check, the names of the lesson's functions it takes)
CHECKS = [(checks.check_online_softmax, "online_softmax_stats"), (checks.check_attention_tiled, "attention_tiled"),
          (checks.check_flash_forward, "flash_attention_forward"),
          (checks.check_flash_forward_memory, "flash_attention_forward"),
          (checks.check_flash_backward, "flash_attention_backward"),
          (checks.check_flash_attention_memory, "flash_attention")]


@pytest.mark.parametrize("check, name", CHECKS, ids=[check.__name__ for check, _ in CHECKS])
def test_reference_passes_every_case(check, name):
    check(getattr(ref, name), cases="all")


def test_stubs_are_reported_not_implemented():
    stub = load_notebook(ROOT / "lessons" / "05_flash_attention.ipynb").module
    for check, name in CHECKS:
        with pytest.raises(NotImplementedYet):
            check(getattr(stub, name))
