"""Lesson 00's checks: the reference passes, PyTorch arithmetic within the budget is named, the stub is reported as
not implemented, and a GPU check without a GPU skips. The registry's mutants and alternatives run in
tests/test_registry_entries.py."""
import pytest
import torch

from autograder.checks import CheckFailed, CheckSkipped, NotImplementedYet, LearnerCodeError
from autograder.checks import first_kernel as checks
from course.notebook_loader import load_solution

ref = load_solution("00_first_kernel")


def test_reference_passes_every_cpu_check():
    checks.check_bytes_of(ref.bytes_of, cases="all")
    checks.check_scaled_add_numerics(ref.scaled_add, cases="all")
    checks.check_scaled_add_memory(ref.scaled_add, cases="all")


def test_pytorch_arithmetic_is_named_even_within_budget(monkeypatch):
    # In-place PyTorch arithmetic stays within the memory budget; the op record still catches it.
    def sneaky(x, y, alpha, out=None):
        out = torch.empty_like(x) if out is None else out
        torch.mul(y, alpha, out=out)
        return out.add_(x)
    with pytest.raises(CheckFailed, match="PyTorch did arithmetic"):
        checks.check_scaled_add_memory(sneaky, cases="all")


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


def test_gpu_check_tells_a_learner_without_failing_their_run_all(monkeypatch, capsys):
    if torch.cuda.is_available():
        pytest.skip("skipped: this machine has a GPU")
    monkeypatch.delenv("MEMFIT_GRADING", raising=False)
    checks.check_scaled_add_gpu(ref.scaled_add)
    assert "SKIPPED: needs a GPU" in capsys.readouterr().out


def test_cases_argument_is_validated():
    with pytest.raises(ValueError, match="cases must be one of"):
        checks.check_bytes_of(ref.bytes_of, cases="everything")
