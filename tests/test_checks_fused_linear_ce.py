"""Lesson 06: the checks pass the reference, reject each mutant with a message a learner can act on,
accept right alternatives, and report stubs as not implemented."""
import pytest

from course import ROOT
from autograder.checks import CheckFailed, NotImplementedYet
from autograder.checks import fused_linear_ce as checks
from course.notebook_loader import load_notebook, load_solution
from tests.mutants import fused_linear_ce as mutants

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


@pytest.mark.parametrize("wrong, message", [
    (mutants.ce_mean_over_all_tokens, r"tokens ignored\), loss: max \|error\|"),
    (mutants.ce_grad_is_softmax, r"dlogits: max \|error\|"),
    (mutants.ce_smoothing_only_in_loss, r"label_smoothing=0.1\), dlogits: max \|error\|"),
    (mutants.ce_softcap_without_chain_rule, r"softcap=5.0\), dlogits: max \|error\|"),
    (mutants.ce_nan_when_all_ignored, r"every token ignored\), loss: .* NaN"),
])
def test_cross_entropy_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_cross_entropy_with_grad(wrong, cases="all")


@pytest.mark.parametrize("wrong, message", [
    (mutants.chunked_mean_per_chunk, r"ignored.*chunk_size=16\), (loss|dx|dw): max \|error\|"),
    (mutants.chunked_all_logits_at_once, r"a tensor of .* existed during the call; the full logits"),
    (mutants.chunked_drops_last_partial_chunk, r"(loss: max \|error\||never written)"),
])
def test_chunked_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_chunked_linear_ce(wrong, cases="all")


@pytest.mark.parametrize("wrong, message", [
    (mutants.tiles_lse_of_each_tile, r"chunks=\(16, 256\)\), (loss|dx): max \|error\|"),
    (mutants.tiles_dw_overwritten_per_chunk, r"dw: max \|error\|"),
    (mutants.tiles_target_without_offset, r"chunks=\(16, 256\)\), dx: max \|error\|"),
    (mutants.tiles_mean_per_chunk, r"ignored.*, (loss|dx): max \|error\|"),
    (mutants.tiles_full_grid_last_chunk, r"chunks=\(16, 300\)\): a kernel wrote .* past the end of a tensor"),
])
def test_fused_forward_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_fused_linear_ce_forward(wrong, cases="all")


def test_fused_memory_rejects_pytorch_softmax():
    with pytest.raises(CheckFailed, match=r"PyTorch computed a softmax \(.*aten\.(_softmax|logsumexp)|a tensor of"):
        checks.check_fused_linear_ce_memory(mutants.tiles_with_torch_softmax)


@pytest.mark.parametrize("wrong, message", [
    (mutants.function_copies_in_backward, "peak extra memory .* a copy doubles dW"),
    (mutants.function_ignores_grad_output, r"backward of 3.0 x loss\), x\.grad: max \|error\|"),
])
def test_function_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_fused_linear_cross_entropy(wrong, cases="all")


@pytest.mark.parametrize("check, right", [
    (checks.check_cross_entropy_with_grad, mutants.ce_by_autograd),
    (checks.check_chunked_linear_ce, mutants.chunked_in_sevens),
    (checks.check_fused_linear_ce_forward, mutants.tiles_other_chunks),
    (checks.check_fused_linear_ce_memory, mutants.tiles_other_chunks),
    (checks.check_fused_linear_cross_entropy, mutants.function_always_in_place),
], ids=lambda x: x.__name__)
def test_right_alternatives_pass(check, right):
    check(right, cases="all")


def test_stubs_are_reported_not_implemented():
    stub = load_notebook(ROOT / "lessons" / "06_fused_linear_ce.ipynb").module
    for check, name in CHECKS:
        with pytest.raises(NotImplementedYet):
            check(getattr(stub, name))
