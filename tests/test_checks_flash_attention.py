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
          (checks.check_flash_delta, "flash_delta"), (checks.check_flash_backward_dv, "flash_attention_backward"),
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


# What a learner reads when a check fails: an element named by its index in each dimension, and causes that fit the
# exercise (the PyTorch exercises have no grid). Each runs the visible cases up to the first failure.
INDEX_4D = r"at index \(\d+, \d+, \d+, \d+\)"


@pytest.mark.parametrize("check, mutant, message", [
    (checks.check_attention_tiled, "tiled_acc_not_rescaled", r", o: max \|error\| .* " + INDEX_4D),
    (checks.check_flash_delta, "delta_of_do_only", r", delta: max \|error\| .* at index \(\d+, \d+, \d+\)"),
    (checks.check_flash_delta, "delta_grid_floored", r", delta: .* NaN, first at index \(\d+, \d+, \d+\)"),
    (checks.check_flash_backward_dv, "backward_dv_before_mask", r", dv: max \|error\| .* " + INDEX_4D),
    (checks.check_flash_backward, "backward_dk_unscaled", r", dk: max \|error\| .* " + INDEX_4D),
    (checks.check_flash_backward, "backward_dq_grid_floored", r", dq: .* NaN, first " + INDEX_4D),
])
def test_messages_name_elements_by_index_in_each_dimension(check, mutant, message):
    import re

    from autograder.checks import CheckFailed
    from tests.mutants import flash_attention as mutants
    with pytest.raises(CheckFailed) as failed:
        check(getattr(mutants, mutant))
    assert re.search(message, str(failed.value)), str(failed.value)
    assert not re.search(r"at index \d", str(failed.value)), str(failed.value)  # never a flat index


@pytest.mark.parametrize("check, mutant", [(checks.check_attention_tiled, "tiled_causal_masks_diagonal"),
                                           (checks.check_online_softmax, "softmax_stats_nan_on_inf_prefix")])
def test_pytorch_exercises_explain_nan_without_a_grid(check, mutant):
    from autograder.checks import CheckFailed
    from tests.mutants import flash_attention as mutants
    with pytest.raises(CheckFailed) as failed:
        check(getattr(mutants, mutant))
    message = str(failed.value)
    assert "NaN" in message and "grid" not in message and "kernel" not in message, message


def test_learner_text_uses_no_internal_words():
    import json
    import re
    nb = json.loads((ROOT / "lessons" / "05_flash_attention.ipynb").read_text())
    text = "\n".join("".join(cell["source"]) for cell in nb["cells"])
    found = re.findall(r"\b(issues?|mutants?|blind set|seeds?|notes)\b", text, flags=re.IGNORECASE)
    assert not found, found
