"""Lessons 01-02: the checks pass the references, grade each exercise on its own, and report stubs as not
implemented. Also pins the facts the lessons teach (Llama-3.1-8B's count, 16 and 20 bytes per parameter). The
registry's mutants and alternatives run in tests/test_registry_entries.py."""
import pytest

from autograder.checks import NotImplementedYet
from autograder.checks import activations as act_checks
from autograder.checks import model_states as state_checks
from course.notebook_loader import load_solution
from memfit.gpt import LLAMA_3_1_8B
from tests.mutants import activations as act_mutants

ref01 = load_solution("01_model_states")
ref02 = load_solution("02_activations")


def test_llama_8b_count_and_bytes_per_parameter():
    n = state_checks.true_param_count(LLAMA_3_1_8B)
    assert n == 8_030_261_248
    assert sum(ref01.state_bytes(n, "amp", "adamw").values()) == 16 * n
    assert sum(ref01.state_bytes(n, "mixed", "adamw").values()) == 16 * n
    assert sum(ref01.state_bytes(n, "mixed_fp32_grads", "adamw").values()) == 20 * n
    assert sum(ref01.state_bytes(n, "bf16", "adamw").values()) == 8 * n


def test_lesson_01_reference_passes():
    state_checks.check_count_params(ref01.count_params, cases="all")
    state_checks.check_state_bytes(ref01.state_bytes, cases="all")
    state_checks.check_state_bytes_measured(ref01.state_bytes, cases="visible")


def test_lesson_02_reference_passes():
    act_checks.check_activation_bytes(ref02.activation_bytes, cases="all")
    act_checks.check_predict_peak(ref02.predict_peak, cases="all")
    act_checks.check_max_micro_batch(ref02.max_micro_batch, cases="all")
    act_checks.check_accumulation_steps(ref02.accumulation_steps, cases="all")


def _with_globals(fn, **replacements):
    """fn with its notebook's globals, some of them replaced (a learner whose earlier exercise is wrong)."""
    import types
    namespace = dict(fn.__globals__, **replacements)
    return types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__)


def test_each_exercise_is_graded_on_its_own():
    """predict_peak runs with the course's activation_bytes and max_micro_batch with the course's predict_peak: a
    wrong exercise 1 or 2 costs its own points only."""
    wrong_activations = _with_globals(ref02.predict_peak, activation_bytes=lambda *a: 0)
    act_checks.check_predict_peak(wrong_activations, cases="visible")
    wrong_predictor = _with_globals(ref02.max_micro_batch, predict_peak=act_mutants.peak_states_only)
    act_checks.check_max_micro_batch(wrong_predictor, cases="all")


def test_axes_are_the_plans():
    """case_axes reads the plans the checks iterate over: one record per case."""
    assert len(act_checks.case_axes("predict_peak", "visible")) == len(act_checks.PEAK_CASES["visible"])
    assert len(act_checks.case_axes("accumulation_steps", "hidden")) == len(act_checks.ACCUMULATION_CASES["hidden"])
    moments = {c["peak at"] for c in act_checks.case_axes("predict_peak", "visible")}
    assert moments == set(act_checks.PEAK_MOMENTS)


def test_stubs_are_reported_as_not_implemented():
    def stub(*args, **kwargs):
        raise NotImplementedError()
    stub.__name__ = "predict_peak"
    for check in (act_checks.check_activation_bytes, act_checks.check_predict_peak, act_checks.check_max_micro_batch,
                  act_checks.check_accumulation_steps, state_checks.check_count_params, state_checks.check_state_bytes,
                  state_checks.check_state_bytes_measured):
        with pytest.raises(NotImplementedYet):
            check(stub)


def test_reference_predicts_the_peak_on_the_gpu():
    import torch
    if not torch.cuda.is_available():
        pytest.skip("skipped: needs a GPU")
    act_checks.check_predict_peak_gpu(ref02.predict_peak, cases="all")


@pytest.mark.parametrize("name", ["tiny", "tiny-mha"])
@pytest.mark.parametrize("precision", ["fp32", "amp", "bf16"])
def test_activation_formula_equals_the_saved_tensor_census(name, precision):
    """Lesson 02's formula, against what saved_tensors_hooks sees block 1 save (block 0 also holds the fp32
    RoPE tables that every block shares)."""
    from memfit.gpt import COURSE_CONFIGS
    from memfit.training import Trainer, random_batch, saved_tensors
    cfg = COURSE_CONFIGS[name]
    trainer = Trainer(cfg, precision, device="cpu")
    idx, targets = random_batch(cfg, 3, 50, "cpu")
    saved = saved_tensors(trainer.model, idx, targets, trainer.autocast())
    block1 = sum(s.nbytes for s in saved if s.module.startswith("blocks.1") and s.kind == "activation")
    assert block1 == ref02.activation_bytes(cfg, 3, 50, precision, "none")
