"""Lesson 04: the checks pass the reference and report stubs as not implemented (the registry's mutants and
alternatives run in tests/test_registry_entries.py)."""
import pytest

from course import ROOT
from autograder.checks import NotImplementedYet
from autograder.checks import kernel_fusion as checks
from course.notebook_loader import load_notebook, load_solution

ref = load_solution("04_kernel_fusion")


def test_reference_passes_every_case():
    checks.check_pow4_numerics(ref.pow4, cases="all")
    checks.check_pow4_memory(ref.pow4, cases="all")
    checks.check_rmsnorm_forward(ref.rmsnorm_forward, cases="all")
    checks.check_rmsnorm_backward(ref.rmsnorm_forward, ref.rmsnorm_backward, cases="all")
    checks.check_swiglu(ref.swiglu_forward, ref.swiglu_backward, cases="all")
    checks.check_fused_gpt(ref.use_fused_kernels, cases="all")
    checks.check_fusion_savings(ref.fusion_savings_per_layer, ref.use_fused_kernels, cases="all")


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
