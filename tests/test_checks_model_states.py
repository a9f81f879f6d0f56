"""Lesson 01's checks after issue 24: every axis of AXES is a case the check runs (case_axes reads the very
records the check iterates over), and a validation message naming the wrong argument fails. The families a blind
tester found (a ValueError naming the wrong argument, names taken case-insensitively, an extra key, float bytes, a
count wrapped to int32) are registry entries that the visible cases reject (tests/test_registry_entries.py). The
lesson's older tests live in tests/test_checks_lessons_01_02.py."""
import pytest

from autograder.checks import CheckFailed
from autograder.checks import model_states as state_checks
from autograder.checks.axes import uncovered
from autograder.checks.contracts import in_decoy
from course.notebook_loader import load_solution

ref01 = load_solution("01_model_states")


def counting(fn):
    """fn, counting its calls (not the contracts' decoy calls before them)."""
    def wrapper(*args, **kwargs):
        wrapper.calls += not in_decoy()
        return fn(*args, **kwargs)
    wrapper.calls = 0
    wrapper.__name__ = fn.__name__
    return wrapper


@pytest.mark.parametrize("cases", ["visible", "hidden"])
def test_case_axes_lists_exactly_the_calls_the_check_makes(cases, monkeypatch):
    """One record per call (count_params, state_bytes) or per trained model (state_bytes_measured); the cases drawn
    from the domain (autograder/checks/domain.py) come beside the records, and are left out here."""
    monkeypatch.setattr(state_checks, "DRAWN_COUNT_CASES", 0)
    monkeypatch.setattr(state_checks, "DRAWN_STATE_CASES", 0)
    for check, fn in (("count_params", ref01.count_params), ("state_bytes", ref01.state_bytes),
                      ("state_bytes_measured", ref01.state_bytes)):
        if check == "state_bytes_measured" and cases == "hidden":
            continue  # trains 12 models: the reference test runs it
        wrapped = counting(fn)
        getattr(state_checks, f"check_{check}")(wrapped, cases=cases)
        assert wrapped.calls == len(state_checks.case_axes(check, cases)), check
        assert not uncovered(state_checks.AXES[check], state_checks.case_axes(check, cases))


def test_reference_passes_every_case():
    state_checks.check_count_params(ref01.count_params, cases="all")
    state_checks.check_state_bytes(ref01.state_bytes, cases="all")
    state_checks.check_state_bytes_measured(ref01.state_bytes, cases="all")


def test_deep_models_are_counted_as_built():
    from memfit.gpt import LLAMA_3_1_8B
    assert state_checks.true_param_count(LLAMA_3_1_8B) == state_checks._built_count(LLAMA_3_1_8B) == 8_030_261_248


def test_swapped_validation_message_fails():
    def swapped(n_params, precision="amp", optimizer="adamw"):
        if optimizer not in ref01.STATE_OPTIMIZERS:
            raise ValueError(f"precision must be one of {ref01.STATE_OPTIMIZERS}, not {optimizer!r}")
        return ref01.state_bytes(n_params, precision, optimizer)
    with pytest.raises(CheckFailed, match=r"raised ValueError\(.*name the bad argument, 'optimizer'"):
        state_checks.check_state_bytes(swapped, cases="visible")
