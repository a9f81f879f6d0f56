"""Lesson 05: the checks pass the reference, reject each mutant with a message a learner can act on,
accept right alternatives, and report stubs as not implemented."""
import pytest

from course import ROOT
from autograder.checks import CheckFailed, NotImplementedYet
from autograder.checks import flash_attention as checks
from course.notebook_loader import load_notebook, load_solution
from tests.mutants import flash_attention as mutants

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


@pytest.mark.parametrize("wrong, message", [
    (mutants.softmax_stats_without_max, r"values near 500, l \(the sum of exp\(x - m\)\)"),
    (mutants.softmax_stats_without_rescale, r"l \(the sum of exp\(x - m\)\): max \|error\|"),
    (mutants.softmax_stats_nan_on_inf_prefix, r"-inf entries \(first\), l \(the sum"),
    (mutants.softmax_stats_cat_logsumexp, r"l \(the sum of exp\(x - m\)\): max \|error\|"),
])
def test_online_softmax_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_online_softmax(wrong, cases="all")


@pytest.mark.parametrize("wrong, message", [
    # in the inputs' dtype (fp16 here) its values fail before its memory does
    (mutants.tiled_naive, r"peak extra memory .* full score matrix|float16.*, o: max \|error\|"),
    (mutants.tiled_causal_sees_next_key, r"causal.*, o: max \|error\|"),
    (mutants.tiled_causal_masks_diagonal, r"causal.*, o: .* NaN"),
    (mutants.tiled_lse_log2, r"lse \(natural log: m \+ log l\): max \|error\|"),
    (mutants.tiled_acc_not_rescaled, r", o: max \|error\|"),
])
def test_attention_tiled_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_attention_tiled(wrong)


@pytest.mark.parametrize("wrong, message", [
    (mutants.forward_grid_floored, "never written"),
    (mutants.forward_lse_log2, r"lse \(natural log: m \+ log l\): max \|error\|"),
    (mutants.forward_diagonal_unmasked, r"causal.*, o: max \|error\|"),
])
def test_flash_forward_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_flash_forward(wrong)


def test_flash_forward_memory_rejects_pytorch_attention():
    with pytest.raises(CheckFailed, match="peak extra memory|PyTorch did arithmetic"):
        checks.check_flash_forward_memory(mutants.forward_with_torch)


@pytest.mark.parametrize("wrong, message", [
    (mutants.backward_delta_zero, r", dq: max \|error\|"),
    (mutants.backward_delta_of_do_only, r", dq: max \|error\|"),
    (mutants.backward_dk_unscaled, r", dk: max \|error\|"),
    (mutants.backward_delta_in_torch, "peak extra memory|PyTorch did arithmetic"),
    (mutants.backward_dq_grid_floored, "dq: .* never written"),
])
def test_flash_backward_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_flash_backward(wrong)


@pytest.mark.parametrize("wrong, message", [
    (mutants.attention_saves_p, "peak extra memory .* for P alone"),
    (mutants.attention_swaps_dk_dv, r"k\.grad: max \|error\|"),
])
def test_flash_attention_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_flash_attention_memory(wrong)


@pytest.mark.parametrize("check, right", [
    (checks.check_online_softmax, mutants.softmax_stats_cat),
    (checks.check_online_softmax, mutants.softmax_stats_cat_shifted_logsumexp),
    (checks.check_attention_tiled, mutants.tiled_visits_every_block),
    (checks.check_flash_forward, mutants.forward_other_tiles),
    (checks.check_flash_forward_memory, mutants.forward_other_tiles),
    (checks.check_flash_backward, mutants.backward_other_tiles),
    (checks.check_flash_attention_memory, mutants.attention_other_tiles),
], ids=lambda x: x.__name__)
def test_right_alternatives_pass(check, right):
    check(right, cases="all")


def test_stubs_are_reported_not_implemented():
    stub = load_notebook(ROOT / "lessons" / "05_flash_attention.ipynb").module
    for check, name in CHECKS:
        with pytest.raises(NotImplementedYet):
            check(getattr(stub, name))
