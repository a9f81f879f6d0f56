"""Lesson 07: the checks pass the reference, reject each mutant with a message a learner can act on,
accept right alternatives, and report stubs as not implemented."""
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


@pytest.mark.parametrize("quantize, dequantize, message", [
    (mutants.q8_truncates, mutants.q8_dequantize, r"exceeds the format's bound \S+ \(\|d\|/2 \+ 127·\|d - d̂\|"),
    (mutants.q8_scale_255, mutants.q8_dequantize, r"the scale of block \d+ is .* = fp16\(absmax / 127\)"),
    (mutants.q8_scale_from_mean, mutants.q8_dequantize, r"the scale of block \d+ is .* = fp16\(absmax / 127\)"),
    (mutants.q8_fp16_scale_codes, mutants.q8_dequantize, r"expected -?\d+: roundf.*the code the fp16 scale gives"),
    (mutants.q8_divides, mutants.q8_dequantize, r"the code of x / d, which rounds differently from x · id"),
    (mutants.q8_floor_half, mutants.q8_dequantize, r"0\.00390624977.* is 1, expected 0: .*floor\(v \+ 0.5\)"),
    (ref.quantize_q8_0, mutants.q8_dequantize_drops_tail, r"dequantized: \d+ values are NaN: never written"),
    (mutants.q8_in_pytorch, mutants.q8_dequantize, r"PyTorch did arithmetic"),
])
def test_q8_0_mutants_fail(quantize, dequantize, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_q8_0(quantize, dequantize, cases="all")


@pytest.mark.parametrize("quantize, message", [
    (mutants.q4_interleaved, r"exceeds the format's bound \S+ \(\|d\| \+ 8·\|d - d̂\|"),
    (mutants.q4_no_clamp, r"exceeds the format's bound"),
    (mutants.q4_fp16_scale_codes, r"expected \d+: min\(15, trunc.*the code the fp16 scale gives"),
    (mutants.q4_positive_wins_ties, r"both have the largest magnitude; m is the first of them"),
    (mutants.q4_divides, r"the code of x / d"),
    (mutants.q4_fma, r"x · id \+ 8.5 rounded once, as an fma"),
])
def test_q4_0_mutants_fail(quantize, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_q4_0(quantize, mutants.q4_dequantize, cases="all")


@pytest.mark.parametrize("fmt, wrong", [("q8_0", mutants.q8_fp16_scale_codes), ("q8_0", mutants.q8_divides),
                                        ("q8_0", mutants.q8_floor_half), ("q4_0", mutants.q4_fp16_scale_codes),
                                        ("q4_0", mutants.q4_positive_wins_ties), ("q4_0", mutants.q4_divides)],
                         ids=lambda v: getattr(v, "__name__", v))
def test_the_departures_from_llama_cpp_fail_the_visible_cases(fmt, wrong):
    """What the text warns about (codes from the fp16 scale, x / d, floor(v + 0.5), the tie rule) fails the visible
    check on its numbers, before the memory cases, so a learner sees it in the notebook."""
    dequantize = mutants.q8_dequantize if fmt == "q8_0" else mutants.q4_dequantize
    with pytest.raises(CheckFailed, match=r"the code of|the scale of block"):
        getattr(checks, f"check_{fmt}")(wrong, dequantize, cases="visible")


@pytest.mark.parametrize("wrong, message", [
    (mutants.mm_one_scale_per_row, r"max \|error\|"),
    (mutants.mm_no_k_mask, r"weight 17? ?.*max \|error\||max \|error\|"),
])
def test_int8_matmul_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_int8_matmul(wrong, cases="all")


def test_int8_matmul_memory_rejects_a_dequantized_copy():
    with pytest.raises(CheckFailed, match=r"a tensor of .* existed during the call; the dequantized weight|at least half the dequantized weight"):
        checks.check_int8_matmul_memory(mutants.mm_dequantize_then_matmul)


@pytest.mark.parametrize("quantize, dequantize, message", [
    (mutants.bw_per_tensor, ref.dequantize_blockwise, r"absmax should be fp32 with one value per block of 256"),
    (mutants.bw_floor_level, ref.dequantize_blockwise, r"store the index of the nearest level"),
    (ref.quantize_blockwise, mutants.bw_dequantize_with_mask, r"dequantize_blockwise.*(raised|\.long\(\) it|should return)"),
])
def test_blockwise_mutants_fail(quantize, dequantize, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_blockwise(quantize, dequantize, cases="all")


@pytest.mark.parametrize("wrong, message", [
    (mutants.adam_no_bias_correction, r"after step 1 .* max \|error\|"),
    (mutants.adam_update_from_rounded_states, r"the 8-bit weight after step 1 .* max \|error\|"),
    (mutants.adam_never_stores_states, r"state\['m'\] after step 1.*nearer|absmax is 0"),
    (mutants.adam_whole_tensor, r"allocated .* over 1 byte per parameter"),
    (mutants.adam_l2_decay, r"after step 1 .* max \|error\|"),
    (mutants.adam_fp32_states, r"should hold 'm' and 'm_absmax'"),
])
def test_adamw8bit_mutants_fail(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_adamw8bit_step(wrong, cases="all")


def test_convergence_rejects_an_optimizer_without_bias_correction():
    with pytest.raises(CheckFailed, match=r"the mean loss of steps .* AdamW's is .* the margin is 2%"):
        checks.check_adamw8bit_convergence(mutants.adam_no_bias_correction)


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


# Right alternatives, on every case.
@pytest.mark.parametrize("check, right, cases", [
    (checks.check_adamw8bit_step, (mutants.adam_right_by_subclass,), "all"),
    (checks.check_q8_0, (mutants.q8_quantize_8_blocks, mutants.q8_dequantize_8_blocks), "all"),
    (checks.check_q4_0, (mutants.q4_quantize_8_blocks, mutants.q4_dequantize_8_blocks), "all"),
    (checks.check_int8_matmul, (mutants.mm_other_tiles,), "all"),
    (checks.check_int8_matmul_memory, (mutants.mm_other_tiles,), "all"),
    (checks.check_blockwise, (mutants.bw_quantize_by_distance, mutants.bw_dequantize_by_take), "all"),
], ids=["adamw8bit by subclass", "q8_0 in 8 blocks per program",
        "q4_0 in 8 blocks per program", "int8 matmul in other tiles", "int8 matmul memory in other tiles",
        "blockwise by distance and take"])
def test_right_alternatives_pass(check, right, cases):
    check(*right, cases=cases)


def test_stubs_are_reported_not_implemented():
    stub = load_notebook(ROOT / "lessons" / "07_quantization.ipynb").module
    for check, names in CHECKS + [(checks.check_adamw8bit_convergence, ("AdamW8bit",))]:
        with pytest.raises(NotImplementedYet):
            check(*[getattr(stub, name) for name in names])
