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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_int8_linear_takes_the_fused_kernel_or_slices_and_keeps_to_one_slice(dtype, monkeypatch):
    """int8_linear (given, lesson 07's prefill path): below min_rows it calls the fused kernel; from min_rows on, Ŵ
    in slices of rows (a ragged last one too) gives dequantize-then-matmul's y, any leading dims and strides, and
    the call allocates y and one slice, no more."""
    from memfit.hardware import size
    from memfit.meter import measure_peak
    device, min_rows = checks.memfit.DEVICE, size("int8_prefill")["min_rows"]
    fused_calls = []
    fused = ref.int8_weight_matmul
    monkeypatch.setattr(ref, "int8_weight_matmul", lambda x, qw: fused_calls.append(x.shape) or fused(x, qw))
    gen = torch.Generator().manual_seed(7)
    n, k = 300, 256  # a CPU's 128 KiB: slices of 128 rows in fp32, 256 in fp16, and a ragged last one (a GPU: one)
    qw = ref.quantize_q8_0((torch.randn(n, k, generator=gen) * 0.02).to(device, dtype))
    w_hat = ref.dequantize_q8_0(qw).to(dtype)
    for shape in ((1, k), (min_rows - 1, k), (min_rows, k), (3, min_rows, k), (min_rows + 5, 2 * k)):
        x = torch.randn(*shape, generator=gen).to(device, dtype)
        x = x[..., ::2] if shape[-1] != k else x
        rows_of_x = x.reshape(-1, k).shape[0]
        fused_calls.clear()
        y, report = measure_peak(ref.int8_linear, x, qw, warmup=checks.memfit.HAS_GPU)
        assert bool(fused_calls) == (rows_of_x < min_rows), (shape, fused_calls)
        want = (x.double() @ w_hat.double().T).to(dtype)
        assert y.shape == (*x.shape[:-1], n) and y.dtype == dtype
        scale = (x.abs().double() @ w_hat.abs().double().T).max().item()
        assert (y.double() - want.double()).abs().max().item() <= 4 * torch.finfo(dtype).eps * scale
        if rows_of_x >= min_rows:
            rows = ref.int8_linear_slice_rows(n, k, dtype)
            x_copy = rows_of_x * k * x.element_size() if x.stride(-1) != 1 else 0  # a strided x made contiguous
            assert report.peak_bytes <= y.nbytes + rows * k * x.element_size() + x_copy
