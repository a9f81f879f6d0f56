"""Lesson 00's checks discriminate: the reference passes, every mutant fails with a useful message,
right alternatives pass, and the stub is reported as not implemented."""
import pytest
import torch

from autograder.checks import CheckFailed, CheckSkipped, NotImplementedYet, LearnerCodeError
from autograder.checks import first_kernel as checks
from course.notebook_loader import load_solution
from tests.mutants import first_kernel as mutants

ref = load_solution("00_first_kernel")


def test_reference_passes_every_cpu_check():
    checks.check_bytes_of(ref.bytes_of, cases="all")
    checks.check_scaled_add_numerics(ref.scaled_add, cases="all")
    checks.check_scaled_add_memory(ref.scaled_add, cases="all")


@pytest.mark.parametrize("wrong, message", [
    (mutants.bytes_of_assumes_fp32, "expected"),
    (mutants.bytes_of_counts_dims, "expected"),
    (mutants.bytes_of_returns_float, "should return an int"),
])
def test_bytes_of_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_bytes_of(wrong, cases="all")


def test_bytes_of_alternative_passes():
    checks.check_bytes_of(mutants.bytes_of_by_allocating, cases="all")


@pytest.mark.parametrize("wrong, message", [
    (mutants.scaled_add_no_store_mask, "past the end of an output"),
    (mutants.scaled_add_grid_floor, "never written"),
    (mutants.scaled_add_alpha_on_x, "exceeds the tolerance"),
    (mutants.scaled_add_ignores_out, "must write into it"),
])
def test_scaled_add_numerics_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_scaled_add_numerics(wrong, cases="all")


@pytest.mark.parametrize("wrong, message", [
    (mutants.scaled_add_in_pytorch, "exceeds the budget"),
    (mutants.scaled_add_fp32_temporaries, "exceeds the budget"),
])
def test_scaled_add_memory_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_scaled_add_memory(wrong, cases="all")


def test_pytorch_arithmetic_is_named_even_within_budget(monkeypatch):
    # In-place PyTorch arithmetic stays within the memory budget; the op record still catches it.
    def sneaky(x, y, alpha, out=None):
        out = torch.empty_like(x) if out is None else out
        torch.mul(y, alpha, out=out)
        return out.add_(x)
    with pytest.raises(CheckFailed, match="PyTorch did arithmetic"):
        checks.check_scaled_add_memory(sneaky, cases="all")


@pytest.mark.parametrize("right", [mutants.scaled_add_block_64, mutants.scaled_add_block_4096])
def test_scaled_add_alternatives_pass(right):
    checks.check_scaled_add_numerics(right, cases="all")
    checks.check_scaled_add_memory(right, cases="all")


def test_stub_is_reported_as_not_implemented():
    def stub(*args, **kwargs):
        raise NotImplementedError()
    with pytest.raises(NotImplementedYet, match="not implemented yet"):
        checks.check_scaled_add_numerics(stub)


def test_learner_exception_names_the_call():
    def broken(x, y, alpha, out=None):
        return x.no_such_method()
    with pytest.raises(LearnerCodeError, match=r"scaled_add\(x, y, alpha=.*raised AttributeError"):
        checks.check_scaled_add_numerics(broken)


def test_gpu_check_is_skipped_under_a_grader_without_a_gpu(monkeypatch):
    monkeypatch.setenv("MEMFIT_GRADING", "1")
    if torch.cuda.is_available():
        checks.check_scaled_add_gpu(ref.scaled_add, cases="all")
    else:
        with pytest.raises(CheckSkipped, match="needs a GPU"):
            checks.check_scaled_add_gpu(ref.scaled_add, cases="all")


@pytest.mark.parametrize("wrong", [
    mutants.scaled_add_no_store_mask, mutants.scaled_add_grid_floor, mutants.scaled_add_alpha_on_x,
    mutants.scaled_add_ignores_out, mutants.scaled_add_in_pytorch, mutants.scaled_add_fp32_temporaries,
], ids=lambda f: f.__name__)
def test_gpu_check_rejects_mutants(wrong):
    if not torch.cuda.is_available():
        pytest.skip("skipped: needs a GPU")
    with pytest.raises(CheckFailed):
        checks.check_scaled_add_gpu(wrong, cases="all")


@pytest.mark.parametrize("right", [mutants.scaled_add_block_64, mutants.scaled_add_block_4096],
                         ids=lambda f: f.__name__)
def test_gpu_check_passes_alternatives(right):
    if not torch.cuda.is_available():
        pytest.skip("skipped: needs a GPU")
    checks.check_scaled_add_gpu(right, cases="all")


def test_gpu_check_tells_a_learner_without_failing_their_run_all(monkeypatch, capsys):
    if torch.cuda.is_available():
        pytest.skip("skipped: this machine has a GPU")
    monkeypatch.delenv("MEMFIT_GRADING", raising=False)
    checks.check_scaled_add_gpu(ref.scaled_add)
    assert "SKIPPED: needs a GPU" in capsys.readouterr().out


def test_cases_argument_is_validated():
    with pytest.raises(ValueError, match="cases must be one of"):
        checks.check_bytes_of(ref.bytes_of, cases="everything")
