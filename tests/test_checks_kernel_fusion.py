"""Lesson 04: the checks pass the reference, reject each mutant with a message a learner can act on,
accept a right alternative, and report stubs as not implemented."""
import pytest

from course import ROOT
from autograder.checks import CheckFailed, NotImplementedYet
from autograder.checks import kernel_fusion as checks
from course.notebook_loader import load_notebook, load_solution
from tests.mutants import kernel_fusion as mutants

ref = load_solution("04_kernel_fusion")


def test_reference_passes_every_case():
    checks.check_pow4_numerics(ref.pow4, cases="all")
    checks.check_pow4_memory(ref.pow4, cases="all")
    checks.check_rmsnorm_forward(ref.rmsnorm_forward, cases="all")
    checks.check_rmsnorm_backward(ref.rmsnorm_forward, ref.rmsnorm_backward, cases="all")
    checks.check_swiglu(ref.swiglu_forward, ref.swiglu_backward, cases="all")
    checks.check_fused_gpt(ref.use_fused_kernels, cases="all")
    checks.check_fusion_savings(ref.fusion_savings_per_layer, ref.use_fused_kernels, cases="all")


@pytest.mark.parametrize("wrong, message", [
    (mutants.pow4_unmasked_store, "past the end"),
    (mutants.pow4_one_block_short, "never written"),
])
def test_pow4_numerics_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_pow4_numerics(wrong, cases="all")


def test_pow4_memory_rejects_eager():
    with pytest.raises(CheckFailed, match="peak extra memory|PyTorch did arithmetic"):
        checks.check_pow4_memory(mutants.pow4_with_torch)


def test_pow4_alternative_passes():
    checks.check_pow4_numerics(mutants.pow4_other_block, cases="all")
    checks.check_pow4_memory(mutants.pow4_other_block, cases="all")


@pytest.mark.parametrize("check, right", [
    (checks.check_rmsnorm_forward, (mutants.rmsnorm_forward_in_column_blocks,)),
    (checks.check_rmsnorm_backward, (ref.rmsnorm_forward, mutants.rmsnorm_backward_row_per_program)),
    (checks.check_rmsnorm_backward, (mutants.rmsnorm_forward_in_column_blocks, mutants.rmsnorm_backward_row_per_program)),
    (checks.check_swiglu, (mutants.swiglu_forward_block_256, mutants.swiglu_backward_block_256)),
], ids=["rmsnorm forward in column blocks", "rmsnorm backward, a program per row", "rmsnorm both alternatives",
        "swiglu in blocks of 256"])
def test_kernel_alternatives_pass(check, right):
    check(*right, cases="all")


@pytest.mark.parametrize("wrong, message", [
    (mutants.rmsnorm_forward_mean_not_rms, "exceeds the tolerance|PyTorch did arithmetic"),
    (mutants.rmsnorm_forward_rstd_in_x_dtype, "rstd should be fp32"),
])
def test_rmsnorm_forward_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_rmsnorm_forward(wrong, cases="all")


@pytest.mark.parametrize("wrong, message", [
    (mutants.rmsnorm_backward_without_projection, "dx"),
    (mutants.rmsnorm_backward_dw_of_last_program, "dweight"),
])
def test_rmsnorm_backward_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_rmsnorm_backward(ref.rmsnorm_forward, wrong)


@pytest.mark.parametrize("forward, backward, message", [
    (ref.swiglu_forward, mutants.swiglu_backward_silu_derivative_wrong, "dgate"),
    (ref.swiglu_forward, mutants.swiglu_backward_stores_silu, "peak extra memory|PyTorch did arithmetic"),
    (mutants.swiglu_forward_contiguous_only, ref.swiglu_backward, "swiglu_forward"),
])
def test_swiglu_mutants_fail(forward, backward, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_swiglu(forward, backward)


def test_fused_gpt_rejects_a_half_swap():
    with pytest.raises(CheckFailed, match="still has eager SwiGLU"):
        checks.check_fused_gpt(mutants.use_fused_norms_only)


@pytest.mark.parametrize("wrong", [mutants.savings_without_rstd_correction, mutants.savings_counts_one_norm])
def test_savings_mutants_fail(wrong):
    with pytest.raises(CheckFailed, match="measured"):
        checks.check_fusion_savings(wrong, ref.use_fused_kernels)


def test_stubs_are_reported_not_implemented():
    stub = load_notebook(ROOT / "lessons" / "04_kernel_fusion.ipynb").module
    for check, names in ((checks.check_pow4_numerics, ("pow4",)), (checks.check_pow4_memory, ("pow4",)),
                         (checks.check_rmsnorm_forward, ("rmsnorm_forward",)),
                         (checks.check_rmsnorm_backward, ("rmsnorm_forward", "rmsnorm_backward")),
                         (checks.check_swiglu, ("swiglu_forward", "swiglu_backward")),
                         (checks.check_fused_gpt, ("use_fused_kernels",)),
                         (checks.check_fusion_savings, ("fusion_savings_per_layer", "use_fused_kernels"))):
        with pytest.raises(NotImplementedYet):
            check(*(getattr(stub, n) for n in names))
