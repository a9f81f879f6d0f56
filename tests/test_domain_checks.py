"""Every check that grades hidden cases drawn from its exercise's whole domain (autograder/checks/domain.py): the
reference keeps its points under every hidden seed, and natural mistakes that every fixed case misses lose them on a
drawn case, shown as the smallest failing case found. (The module's own tests, and lessons 00-03's mistakes, are in
tests/test_domain.py.)"""
import importlib

import pytest
import torch

from autograder.checks import CheckFailed, checks_for, checks_module
from autograder.checks.domain import HIDDEN_SEED_ENV, grade_drawn
from autograder.checks.quantization import PROFILE_DTYPES
from course.notebook_loader import load_solution
from tests.mutants.registry import LESSONS

# Imported now: its first import, inside a call q8_0's memory case measures, once tripped the host-memory contract
# (host_memory carried the import's blocks past the next launch's pause; it now leaves library blocks out).
import torch._dynamo  # noqa: E402,F401

# Every check draws cases from its exercise's domain, but these, for the reason given.
NOT_DRAWN = {
    ("08_fine_tune", "nf4_code"): "nf4_code() takes no argument: its one answer, the 16 levels, is compared whole",
    ("07_quantization", "adamw8bit_convergence"): "one 200-step training run of the course's tiny GPT on its corpus "
                                                  "(minutes on a CPU); the optimizer's step over drawn parameters, "
                                                  "gradients, chunks and hyperparameters is adamw8bit_step's",
}
ALL_CHECKS = [(lesson, check.name) for lesson in LESSONS for check in checks_for(lesson)]
ADOPTED = [pair for pair in ALL_CHECKS if pair not in NOT_DRAWN]
# seconds or more a run on a CPU: one other seed here (seed 0 runs in the registry's, blind and counterfactual tests)
ONE_SEED = {"flash_forward", "flash_delta", "flash_backward_dv", "flash_backward", "flash_forward_memory",
            "flash_attention_memory", "fused_linear_ce_forward", "fused_linear_ce_memory", "fused_linear_cross_entropy",
            "fused_gpt", "fake_step_memory", "zero_adamw", "zero_memory", "zero_on_gloo", "predict_peak",
            "activation_bytes", "int8_matmul_memory", "fusion_savings"}
GPU_ONLY = {"scaled_add_gpu", "predict_peak_gpu"}
SEEDED = [(lesson, name, seed) for lesson, name in ADOPTED for seed in ((1,) if name in ONE_SEED else (0, 1, 2, 3))]


def test_not_drawn_names_checks_that_exist():
    assert set(NOT_DRAWN) <= set(ALL_CHECKS)


def _check(lesson: str, name: str):
    return next(c for c in checks_for(lesson) if c.name == name)


@pytest.fixture
def grading(monkeypatch):
    monkeypatch.setenv("MEMFIT_GRADING", "1")

    def with_seed(seed: int) -> None:
        monkeypatch.setenv(HIDDEN_SEED_ENV, str(seed))
    return with_seed


@pytest.mark.parametrize("lesson, name, seed", SEEDED, ids=[f"{name}-{seed}" for _, name, seed in SEEDED])
def test_the_reference_passes_its_drawn_cases_under_other_seeds(lesson, name, seed, grading, monkeypatch):
    """...and every check not in NOT_DRAWN does draw: its module's grade_drawn is called with the check's name."""
    if name in GPU_ONLY and not torch.cuda.is_available():
        pytest.skip("skipped: needs a GPU")
    grading(seed)
    check = _check(lesson, name)
    module = importlib.import_module(checks_module(lesson))
    drew = []

    def recording(domain, check_name, count, check_one):
        drew.append(check_name)
        return grade_drawn(domain, check_name, count, check_one)
    monkeypatch.setattr(module, "grade_drawn", recording)
    reference = load_solution(lesson)
    check.run(*(getattr(reference, use) for use in check.uses), cases="hidden")
    assert name in drew, f"{name} drew no case: give it a domain and grade_drawn, or a reason in NOT_DRAWN"


def test_pow4_result_allocated_like_a_transposed_input_is_caught(grading):
    """Computes on a contiguous copy (as the text allows) but allocates the result with torch.empty_like(a), which
    keeps a transposed a's strides, and fills it as a flat array. The fixed cases' only view has gaps (empty_like
    then gives a contiguous tensor), so only a drawn transposed `a` shows it."""
    ref = load_solution("04_kernel_fusion")

    def pow4(a, out=None):
        out = torch.empty_like(a) if out is None else out
        out.as_strided((a.numel(),), (1,), out.storage_offset()).copy_(ref.pow4(a.contiguous()).view(-1))
        return out

    grading(0)
    with pytest.raises(CheckFailed, match=r"smallest failing case found: .*layout=transposed.*: pow4\(a\) with a of "
                                          r"shape .* \(strided .*: at index \d+ .* expected"):
        _check("04_kernel_fusion", "pow4_numerics").run(pow4, cases="all")


def test_rmsnorm_forward_with_a_block_capped_at_4096_columns_is_caught(grading):
    """One block of at most 4096 columns (to spare registers) and no loop over the rest of the row: the fixed cases'
    longest row is 4096, the text allows rows up to memfit.config("rmsnorm")["BLOCK"]."""
    ref = load_solution("04_kernel_fusion")

    def rmsnorm_forward(x, weight, eps=1e-5):
        h = x.shape[-1]
        rows = x.reshape(-1, h).contiguous()
        y, rstd = torch.empty_like(rows), torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
        block = min(1 << (h - 1).bit_length(), 4096)
        ref.rmsnorm_forward_kernel[(rows.shape[0],)](rows, weight, y, rstd, rows.stride(0), h, eps, BLOCK=block,
                                                     num_warps=4 if block <= 2048 else 8)  # the text's warps
        return y.view(x.shape), rstd

    grading(1)
    with pytest.raises(CheckFailed, match=r"smallest failing case found: h=(409[7-9]|4[1-9]\d\d|[5-9]\d{3}|1\d{4}), "
                                          r".*output elements are NaN, first at index .*4,?096"):
        _check("04_kernel_fusion", "rmsnorm_forward").run(rmsnorm_forward, cases="all")


@pytest.mark.skipif("bf16" in PROFILE_DTYPES, reason="this profile's fixed cases run bf16 and catch it first")
def test_blockwise_that_upcasts_fp16_only_is_caught(grading):
    """Upcasts "half precision" to fp32 and takes bf16 for fp32, so a bf16 x gets a bf16 absmax (the text allows
    fp32, fp16 and bf16; the fixed cases run the profile's dtypes, fp32 and fp16 on a CPU)."""
    ref = load_solution("07_quantization")

    def quantize_blockwise(x, code, block=256):
        codes, absmax = ref.quantize_blockwise(x, code, block)
        return codes, absmax.to(x.dtype) if x.dtype == torch.bfloat16 else absmax

    grading(0)
    with pytest.raises(CheckFailed, match=r"smallest failing case found: .*dtype=bf16: quantize_blockwise\(.*"
                                          r"bfloat16.*absmax should be fp32"):
        _check("07_quantization", "blockwise").run(quantize_blockwise, ref.dequantize_blockwise, cases="all")
