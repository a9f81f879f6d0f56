"""Lesson 07: the checks pass the reference, reject the wrong code written here (past the end, a kept cache, codes
rounded to even), and report stubs as not implemented. The registry's mutants and alternatives run in
tests/test_registry_entries.py."""
import pytest
import torch

from course import ROOT
from autograder.checks import CheckFailed, NotImplementedYet
from autograder.checks import quantization as checks
from course.notebook_loader import load_notebook, load_solution
from tests.mutants import quantization as mutants

ref = load_solution("07_quantization")

# (check, the names of the lesson's functions it takes)
CHECKS = [(checks.check_q8_0, ("quantize_q8_0", "dequantize_q8_0")),
          (checks.check_q4_0, ("quantize_q4_0", "dequantize_q4_0")),
          (checks.check_int8_matmul, ("int8_weight_matmul",)),
          (checks.check_int8_matmul_memory, ("int8_weight_matmul",)),
          (checks.check_blockwise, ("quantize_blockwise", "dequantize_blockwise")),
          (checks.check_adamw8bit_step, ("AdamW8bit",))]


@pytest.mark.parametrize("check, names", CHECKS, ids=[check.__name__ for check, _ in CHECKS])
def test_reference_passes_every_case(check, names):
    check(*[getattr(ref, name) for name in names], cases="all")


def test_reference_converges():
    """The grader's run (all steps); the notebook's visible run is its first visible_steps."""
    curves = checks.check_adamw8bit_convergence(ref.AdamW8bit, cases="all")
    assert [len(c) for c in curves.values()] == [checks.CONVERGENCE["steps"]] * 2


def test_q4_0_in_pytorch_is_right_in_its_numbers(monkeypatch):
    """A PyTorch-written Q4_0 (without input validation) loses its points only to the memory cases' no-PyTorch rule
    and the bad-input cases."""
    monkeypatch.setattr(checks, "BLOCK_MEMORY_CASES", [])
    monkeypatch.setattr(checks, "BLOCK_INVALID_CASES", [])
    checks.check_q4_0(mutants.q4_quantize, mutants.q4_dequantize, cases="hidden")


def test_a_dequantize_masked_by_block_writes_past_the_end():
    with pytest.raises(CheckFailed, match=r"dequantized: a kernel wrote \d+ elements past the end of a tensor"):
        checks.check_q8_0(ref.quantize_q8_0, mutants.q8_dequantize_masked_by_block)


def test_a_cached_dequantized_weight_is_kept_memory():
    with pytest.raises(CheckFailed, match=r"stayed allocated after the call"):
        checks.check_int8_matmul_memory(mutants.mm_keeps_cache)


def test_adamw8bit_is_graded_with_the_reference_blockwise():
    checks.check_adamw8bit_step(mutants.adam_with_broken_blockwise, cases="visible")
    assert mutants.quantize_blockwise.__module__ == mutants.__name__  # given back after the check


def test_codes_at_exact_ties_round_half_away():
    w = checks.weights("ties", (64,), 1).to(checks.memfit.DEVICE)
    qt = checks.reference_q8_0(w)
    checks._check_codes("q8_0", qt, w, "ties")
    q = qt.data.long()
    even = q - ((q.abs() % 2 == 1) & (q.abs() > 0)).long() * q.sign()  # an odd code at a tie: toward the even one
    wrong = checks.lesson.Quantized("q8_0", even.to(torch.int8), qt.scales, qt.shape, qt.dtype)
    with pytest.raises(CheckFailed, match=r"halves away from zero"):
        checks._check_codes("q8_0", wrong, w, "ties")


def test_stubs_are_reported_not_implemented():
    stub = load_notebook(ROOT / "lessons" / "07_quantization.ipynb").module
    for check, names in CHECKS + [(checks.check_adamw8bit_convergence, ("AdamW8bit",))]:
        with pytest.raises(NotImplementedYet):
            check(*[getattr(stub, name) for name in names])
