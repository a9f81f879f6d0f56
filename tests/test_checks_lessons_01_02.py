"""Lessons 01-02: the checks pass the references, reject each mutant with a message a learner can act
on, accept right alternatives, and report stubs as not implemented. Also pins the facts the lessons
teach (Llama-3.1-8B's count, 16 and 20 bytes per parameter)."""
import pytest

from autograder.checks import CheckFailed, NotImplementedYet
from autograder.checks import activations as act_checks
from autograder.checks import model_states as state_checks
from course.notebook_loader import load_solution
from memfit.gpt import LLAMA_3_1_8B
from tests.mutants import activations as act_mutants
from tests.mutants import model_states as state_mutants

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


@pytest.mark.parametrize("wrong, message", [
    (state_mutants.count_params_always_untied, "the embedding or the output head"),
    (state_mutants.count_params_ignores_gqa, "grouped-query"),
    (state_mutants.count_params_forgets_norms, "RMSNorm"),
    (state_mutants.count_params_rule_of_thumb, "expected"),
])
def test_count_params_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        state_checks.check_count_params(wrong, cases="all")


def test_count_params_alternative_passes():
    state_checks.check_count_params(state_mutants.count_params_by_building, cases="all")


@pytest.mark.parametrize("wrong, message", [
    (state_mutants.state_bytes_amp_in_half, r"\['params'\]: expected"),
    (state_mutants.state_bytes_no_master, r"\['optimizer'\]"),
    (state_mutants.state_bytes_fp32_grads_replace, r"\['grads'\]"),
    (state_mutants.state_bytes_8bit_without_scales, r"\['optimizer'\]"),
    (state_mutants.state_bytes_accepts_anything, "raise ValueError"),
])
def test_state_bytes_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        state_checks.check_state_bytes(wrong, cases="all")


def test_state_bytes_measured_rejects_half_weights_under_amp():
    with pytest.raises(CheckFailed, match="measured"):
        state_checks.check_state_bytes_measured(state_mutants.state_bytes_amp_in_half, cases="visible")


def test_lesson_02_reference_passes():
    act_checks.check_activation_bytes(ref02.activation_bytes, cases="all")
    act_checks.check_predict_peak(ref02.predict_peak, cases="all")
    act_checks.check_max_micro_batch(ref02.max_micro_batch, cases="all")
    act_checks.check_accumulation_steps(ref02.accumulation_steps, cases="all")


@pytest.mark.parametrize("wrong, cases", [
    (act_mutants.activations_without_lse, "visible"),
    (act_mutants.activations_mha_as_gqa, "hidden"),
    (act_mutants.activations_norms_in_half, "visible"),
    (act_mutants.activations_full_keeps_nothing, "visible"),
    (act_mutants.activations_selective_without_attention_output, "hidden"),
])
def test_activation_bytes_mutants_fail(wrong, cases):
    with pytest.raises(CheckFailed, match="kept per block"):
        act_checks.check_activation_bytes(wrong, cases=cases)


@pytest.mark.parametrize("wrong, cases, message", [
    (act_mutants.peak_states_only, "visible", "error"),
    (act_mutants.peak_without_logit_gradients, "visible", "error"),
    (act_mutants.peak_without_adam_temporary, "hidden", "error"),
    (act_mutants.peak_ignores_recompute, "visible", "error"),
    (act_mutants.peak_not_the_sum, "visible", "not the sum"),
])
def test_predict_peak_mutants_fail(wrong, cases, message):
    with pytest.raises(CheckFailed, match=message):
        act_checks.check_predict_peak(wrong, cases=cases)


@pytest.mark.parametrize("wrong", [
    act_mutants.peak_without_block_copies, act_mutants.peak_without_head_copy, act_mutants.peak_sgd_temporary,
    act_mutants.peak_fp32_temporary_in_bf16, act_mutants.peak_without_optimizer_step,
    act_mutants.peak_one_logits_gradient, act_mutants.peak_last_block_only, act_mutants.peak_first_block_only,
    act_mutants.peak_without_recomputed_block, act_mutants.peak_without_working_gradients,
])
def test_each_term_of_the_prediction_decides_a_visible_case(wrong):
    """A predictor missing any one term (or adding one) fails on the visible cases: none meets a new kind of
    failure at grading time."""
    with pytest.raises(CheckFailed, match="error"):
        act_checks.check_predict_peak(wrong, cases="visible")


def test_predict_peak_alternative_passes():
    act_checks.check_predict_peak(act_mutants.peak_every_block, cases="visible")


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


@pytest.mark.parametrize("wrong, message", [
    (act_mutants.max_micro_batch_off_by_one, "expected"),
    (act_mutants.max_micro_batch_ignores_predict, "use the `predict` argument"),
])
def test_max_micro_batch_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        act_checks.check_max_micro_batch(wrong, cases="all")


def test_max_micro_batch_alternative_passes():
    act_checks.check_max_micro_batch(act_mutants.max_micro_batch_linear_scan, cases="all")


@pytest.mark.parametrize("wrong", [act_mutants.accumulation_floor, act_mutants.accumulation_ignores_ranks])
def test_accumulation_mutants_fail(wrong):
    with pytest.raises(CheckFailed, match="round up"):
        act_checks.check_accumulation_steps(wrong, cases="all")


def test_stubs_are_reported_as_not_implemented():
    def stub(*args, **kwargs):
        raise NotImplementedError()
    stub.__name__ = "predict_peak"
    for check in (act_checks.check_activation_bytes, act_checks.check_predict_peak, act_checks.check_max_micro_batch,
                  act_checks.check_accumulation_steps, state_checks.check_count_params, state_checks.check_state_bytes,
                  state_checks.check_state_bytes_measured):
        with pytest.raises(NotImplementedYet):
            check(stub)


def test_predict_peak_on_the_gpu():
    import torch
    if not torch.cuda.is_available():
        pytest.skip("skipped: needs a GPU")
    act_checks.check_predict_peak_gpu(ref02.predict_peak, cases="all")
    with pytest.raises(CheckFailed, match="error"):
        act_checks.check_predict_peak_gpu(act_mutants.peak_without_logit_gradients, cases="visible")


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
