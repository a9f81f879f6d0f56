"""Which known-wrong and known-right implementations each graded check is proven against, and what proves it.

    REGISTRY[lesson][check name] = {"wrong": [Wrong(...), ...], "right": [Right(...), ...]}

One key per lesson 00-09 and, inside it, one key per Check of autograder/checks/<topic>.py's CHECKS (the
check's name is its nbgrader grade_id). An entry's `functions` names attributes of tests/mutants/<topic>.py, the
lesson's mutant module (`mutant_module(lesson)`), that stand in for the learner functions the check is given
(Check.uses):

- a check that uses one function: the mutant's name, a string;
- a check that uses several (Check.uses has more than one name): a dict with exactly the names of Check.uses
  as keys, each mapped to a mutant's name or to REF ("ref"), the reference solution's own function
  (course.notebook_loader.load_solution(lesson), or the same code in memfit.from_lessons.<topic>). At least
  one value is a mutant. `as_mapping(entry, uses)` turns either form into the dict form.

    Wrong(functions, message, raises=CheckFailed)   the check must reject it: the learner loses the points.
        `message` is a regex (re.search) the check's message must contain: what the learner is told; `raises`
        the exact class of the exception (CheckFailed: a wrong answer; LearnerCodeError: the learner's code
        raised, reported with the call that raised). Wrong(..., visible=True): the visible cases alone reject it,
        with that message, so the learner meets the failure in the notebook rather than at grading time.
    Right(functions, cases="all")                   a correct alternative, another free design choice (block
        sizes, chunk sizes, loop orders, another algorithm), that keeps the points.

tests/test_registry_entries.py runs every entry through its check as the grader does, check.run(*functions,
cases="all") under MEMFIT_GRADING=1, and a wrong entry marked visible also with cases="visible";
tests/test_mutant_registry.py verifies, without running any check, that this table covers every check of every
lesson, that every name exists and that no entry is both wrong and right.

What the tests prove, exactly:
- GPU-only checks (Check.needs_gpu: 00 scaled_add_gpu, 02 predict_peak_gpu): their entries skip, with the reason
  "skipped: needs a GPU", on a machine without one.
- Every wrong entry but one is proven on all of the check's cases: 07 adamw8bit_convergence's is proven on the
  visible cases, the first 60 of the grader's 200 training steps, where it fails the same way (the reason is in
  tests/test_registry_entries.py's CASES_INSTEAD_OF_ALL).
- Most right entries are proven on all of the check's cases. Two are proven on the visible cases only
  (Right(..., cases="visible")), to keep `make test` short: 03 ZeroForeachAdamW for zero_memory
  (all its cases, 7-12 s on a 2-core CPU, passed when the registry was written and again in issue 26)
  and 02 peak_every_block for predict_peak (all its cases, passed in issue 26: 12 s, mostly the reference steps
  its hidden cases measure).
- 03 ZeroGatherIgnoresOut (zero_adamw) used to depend on the allocator (a resized storage can come back holding
  its old bytes, and then a gather that ignores `out` went unseen: it passed on an H100 machine's CPU with torch
  2.11); memfit.zero's refill now fills the storage with NaN before the gather, so it fails everywhere.
- Not listed, though in the mutant modules: 07 q4_quantize / q4_dequantize (right numbers in PyTorch: only
  the hidden cases accept them, the visible ones reject PyTorch arithmetic, so under the grader they lose
  the points without being a "wrong" answer), and right entries for the checks where no alternative is
  proven (07 adamw8bit_convergence, say: 200 training steps, 2 minutes a run).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Union

from autograder.checks import CheckFailed, LearnerCodeError
from course.lessons import lessons, topic

REF = "ref"  # in a multi-function entry: the reference solution's own function

LESSONS = tuple(lessons())  # every lesson of solutions/: a new one without entries fails test_mutant_registry

Functions = Union[str, dict]  # a mutant's name, or {learner function: mutant name or REF}


@dataclass(frozen=True)
class Wrong:
    """The check rejects these functions: it raises `raises` (this class exactly) with a message `message` matches."""
    functions: Functions
    message: str  # a regex, searched for in the message
    raises: type = CheckFailed
    visible: bool = False  # the visible cases alone reject it: a learner sees it in the notebook, before grading


@dataclass(frozen=True)
class Right:
    """The check passes these functions on `cases`."""
    functions: Functions
    cases: str = "all"


Entry = Union[Wrong, Right]

BUDGET = "exceeds the budget"  # lesson 00's memory check: peak extra memory over the budget
MAX_ERROR = r"max \|error\|"  # a numbers check: the largest difference from the reference
PEAK_ERROR = r"error [-+]\d+\.\d%, allowed ±3\.0%"  # 02 predict_peak: the predicted peak is off
GPU_PEAK_ERROR = r"error [-+]\d+\.\d%, allowed ±2\.0%"  # ... and on the GPU
TORCH_MEMORY = "peak extra memory|PyTorch did arithmetic"  # a kernel check's memory case: an eager PyTorch version
SOFTMAX_SUM = r"l \(the sum of exp\(x - m\)\)"  # 05 online_softmax: the statistic l is wrong
DV_HINT = r"dv = Pᵀ dO needs neither delta nor dq"  # 05 flash_backward_dv: the hint that points at the dK/dV kernel


def _scaled_add(*wrong: Wrong) -> dict:
    return {"wrong": list(wrong), "right": [Right("scaled_add_block_64"), Right("scaled_add_block_4096")]}


def _q8(quantize: str, message: str, dequantize: str = "q8_dequantize", visible: bool = False) -> Wrong:
    return Wrong({"quantize_q8_0": quantize, "dequantize_q8_0": dequantize}, message, visible=visible)


def _nf4(quantize: str, dequantize: str, message: str) -> Wrong:
    return Wrong({"quantize_nf4": quantize, "dequantize_nf4": dequantize}, message, visible=True)


def _plan(plan: str, tokens: str, message: str) -> Wrong:
    return Wrong({"plan_fine_tune": plan, "most_tokens": tokens}, message, visible=True)


def _q4(quantize: str, message: str, visible: bool = False) -> Wrong:
    return Wrong({"quantize_q4_0": quantize, "dequantize_q4_0": "q4_dequantize"}, message, visible=visible)


def _ops(message: str, raises: type = CheckFailed, **mutants: str) -> Wrong:
    """09 conjugate_ops: the named operators are mutants, the others the reference's; the visible cases reject it."""
    return Wrong({op: mutants.get(op, REF) for op in ("tp_copy", "tp_reduce", "sp_gather", "sp_scatter")}, message,
                 raises=raises, visible=True)


TP_OUTPUT = r"sequence_parallel=False, rank 0: the output: max \|error\|"  # 09 tp_block: the block's output is off
RING_OUTPUT = r"rank 0 \(positions 0\.\.3 and 12\.\.15\): the output: max \|error\|"  # 09 ring_attention: ... and its
RING_PASSES = r"ring_pass sent .* in backward; the ring needs .*their gradients \(fp32, fp64 for fp64 inputs\) cp times"
PLAN_SLOWER = r"which loses .* s a step \(layout_cost\); .* fits too and loses .* search every layout"  # 09 planner


REGISTRY: dict[str, dict[str, dict[str, list[Entry]]]] = {
    "00_first_kernel": {
        "bytes_of": {"wrong": [Wrong("bytes_of_assumes_fp32", "expected"), Wrong("bytes_of_counts_dims", "expected"),
                               Wrong("bytes_of_returns_float", "float .* where int is declared")],
                     "right": [Right("bytes_of_by_allocating")]},
        "scaled_add_numerics": _scaled_add(Wrong("scaled_add_no_store_mask", "past the end of an output"),
                                           Wrong("scaled_add_grid_floor", "never written"),
                                           Wrong("scaled_add_alpha_on_x", "exceeds the tolerance"),
                                           Wrong("scaled_add_ignores_out", "must write into it")),
        "scaled_add_memory": _scaled_add(Wrong("scaled_add_in_pytorch", BUDGET),
                                         Wrong("scaled_add_fp32_temporaries", BUDGET)),
        "scaled_add_gpu": _scaled_add(Wrong("scaled_add_no_store_mask", "past the end of an output"),
                                      Wrong("scaled_add_grid_floor", "never written"),
                                      Wrong("scaled_add_alpha_on_x", "exceeds the tolerance"),
                                      Wrong("scaled_add_ignores_out", "must write into it"),
                                      Wrong("scaled_add_in_pytorch", BUDGET),
                                      Wrong("scaled_add_fp32_temporaries", BUDGET)),
    },
    "01_model_states": {
        "count_params": {"wrong": [Wrong("count_params_always_untied", "the embedding or the output head"),
                                   Wrong("count_params_ignores_gqa", "grouped-query"),
                                   Wrong("count_params_forgets_norms", "RMSNorm"),
                                   Wrong("count_params_rule_of_thumb", "expected"),
                                   Wrong("count_params_int32", r"Llama-3.1-8B\): expected 8,030,261,248",
                                         visible=True)],
                         "right": [Right("count_params_by_building")]},
        # visible=True: the families a blind tester found (a message without the bad argument, names taken
        # case-insensitively, an extra key, float bytes, a count wrapped to int32) are rejected in the notebook.
        "state_bytes": {"wrong": [Wrong("state_bytes_amp_in_half", r"\['params'\]: expected"),
                                  Wrong("state_bytes_no_master", r"\['optimizer'\]"),
                                  Wrong("state_bytes_fp32_grads_replace", r"\['grads'\]"),
                                  Wrong("state_bytes_8bit_without_scales", r"\['optimizer'\]"),
                                  Wrong("state_bytes_accepts_anything", "raise ValueError"),
                                  Wrong("state_bytes_message_without_argument",
                                        "should name the bad argument, 'precision'", visible=True),
                                  Wrong("state_bytes_case_insensitive", r"'AMP'.*returned a value.*case-sensitive",
                                        visible=True),
                                  Wrong("state_bytes_with_total", r"extra keys \['total'\]", visible=True),
                                  Wrong("state_bytes_float_bytes", r"float .* where int is declared", visible=True)],
                        "right": [Right("state_bytes_by_table")]},
        "state_bytes_measured": {"wrong": [Wrong("state_bytes_amp_in_half", "measured")],
                                 "right": [Right("state_bytes_by_table")]},
    },
    "02_activations": {
        "activation_bytes": {"wrong": [Wrong("activations_without_lse", "kept per block"),
                                       Wrong("activations_mha_as_gqa", "kept per block"),
                                       Wrong("activations_norms_in_half", "kept per block"),
                                       Wrong("activations_full_keeps_nothing", "kept per block"),
                                       Wrong("activations_selective_without_attention_output", "kept per block")],
                             "right": []},
        # visible=True: a predictor missing any one term (or adding one) fails on the visible cases, so none meets
        # a new kind of failure at grading time.
        "predict_peak": {"wrong": [Wrong("peak_states_only", PEAK_ERROR),
                                   Wrong("peak_without_logit_gradients", PEAK_ERROR),
                                   Wrong("peak_without_adam_temporary", PEAK_ERROR),
                                   Wrong("peak_ignores_recompute", PEAK_ERROR),
                                   Wrong("peak_not_the_sum", "not the sum"),
                                   Wrong("peak_without_block_copies", PEAK_ERROR, visible=True),
                                   Wrong("peak_without_head_copy", PEAK_ERROR, visible=True),
                                   Wrong("peak_sgd_temporary", PEAK_ERROR, visible=True),
                                   Wrong("peak_fp32_temporary_in_bf16", PEAK_ERROR, visible=True),
                                   Wrong("peak_without_optimizer_step", PEAK_ERROR, visible=True),
                                   Wrong("peak_one_logits_gradient", PEAK_ERROR, visible=True),
                                   Wrong("peak_last_block_only", PEAK_ERROR, visible=True),
                                   Wrong("peak_first_block_only", PEAK_ERROR, visible=True),
                                   Wrong("peak_without_recomputed_block", PEAK_ERROR, visible=True),
                                   Wrong("peak_without_working_gradients", PEAK_ERROR, visible=True)],
                         "right": [Right("peak_every_block", cases="visible")]},
        "predict_peak_gpu": {"wrong": [Wrong("peak_without_logit_gradients", GPU_PEAK_ERROR)], "right": []},
        "max_micro_batch": {"wrong": [Wrong("max_micro_batch_off_by_one", "expected"),
                                      Wrong("max_micro_batch_ignores_predict", "use the `predict` argument")],
                            "right": [Right("max_micro_batch_linear_scan")]},
        "accumulation_steps": {"wrong": [Wrong("accumulation_floor", "round up"),
                                         Wrong("accumulation_ignores_ranks", "round up")],
                               "right": []},
    },
    "03_zero": {
        "shard_bounds": {"wrong": [Wrong("shard_bounds_floor", "ceil"), Wrong("shard_bounds_off_by_one", "expected")],
                         "right": [Right("shard_bounds_with_math")]},
        "zero_adamw": {"wrong": [Wrong("ZeroSumsWithoutDividing", "unsharded AdamW gives"),
                                 Wrong("ZeroStage1AllReduces", "stage 1, .*: a step sent .* through collectives"),
                                 Wrong("ZeroGatherIgnoresOut", "stage 3"),
                                 Wrong("ZeroAcceptsAnyStage", "raise ValueError")],
                       # Not ZeroForeachAdamW: the text asks for AdamW(foreach=False) and bitwise fp32 parameters;
                       # torch's multi-tensor AdamW gives the same bits on a CPU but not on an H100 (1 ulp on 10 of
                       # 100 draws). The blind set's right entries stand for this check.
                       "right": []},
        "zero_memory": {"wrong": [Wrong("ZeroStage2KeepsFullGradient", "more than the stage allows survive"),
                                  Wrong("ZeroForgetsMasterInBuffers", "master copy")],
                        "right": [Right("ZeroForeachAdamW", cases="visible")]},
        "zero_bytes_per_rank": {"wrong": [Wrong("zero_bytes_unpadded", "expected|should|you returned"),
                                          Wrong("zero_bytes_stage2_shards_params", "expected|should|you returned")],
                                "right": []},
        "comm_bytes_per_rank": {"wrong": [Wrong("comm_bytes_stage3_gathers_once", "expected|should|you returned"),
                                          Wrong("comm_bytes_whole_vectors", "expected|should|you returned")],
                                "right": []},
        "zero_on_gloo": {"wrong": [Wrong({"ZeroAdamW": "ZeroSumsWithoutDividing", "zero_bytes_per_rank": REF},
                                         "differ from unsharded AdamW"),
                                   Wrong({"ZeroAdamW": REF, "zero_bytes_per_rank": "zero_bytes_stage2_shards_params"},
                                         "your zero_bytes_per_rank predicts")],
                         "right": []},
        "deepspeed_estimate": {"wrong": [Wrong("estimate_16_bytes_without_offload", "expected|should|you returned"),
                                         Wrong("estimate_without_buffer_factor", "expected|should|you returned")],
                               "right": []},
        "prefetch_timeline": {"wrong": [Wrong("timeline_without_memory_cap", "expected|should|you returned"),
                                        Wrong("timeline_peak_from_depth", "expected|should|you returned")],
                              "right": []},
    },
    "04_kernel_fusion": {
        "pow4_numerics": {"wrong": [Wrong("pow4_unmasked_store", "past the end"),
                                    Wrong("pow4_one_block_short", "never written")],
                          "right": [Right("pow4_other_block")]},
        "pow4_memory": {"wrong": [Wrong("pow4_with_torch", TORCH_MEMORY)], "right": [Right("pow4_other_block")]},
        "rmsnorm_forward": {"wrong": [Wrong("rmsnorm_forward_mean_not_rms",
                                            "exceeds the tolerance|PyTorch did arithmetic"),
                                      Wrong("rmsnorm_forward_rstd_in_x_dtype", "rstd should be fp32"),
                                      Wrong("rmsnorm_forward_one_warp_count", "num_warps=8")],
                            "right": [Right("rmsnorm_forward_in_column_blocks")]},
        "rmsnorm_backward": {
            "wrong": [Wrong({"rmsnorm_forward": REF, "rmsnorm_backward": "rmsnorm_backward_without_projection"}, "dx"),
                      Wrong({"rmsnorm_forward": REF, "rmsnorm_backward": "rmsnorm_backward_dw_of_last_program"},
                            "dweight"),
                      Wrong({"rmsnorm_forward": REF, "rmsnorm_backward": "rmsnorm_backward_row_per_program"},
                            "fp32 buffer of partial dw rows"),
                      Wrong({"rmsnorm_forward": REF, "rmsnorm_backward": "rmsnorm_backward_atomic_dw"},
                            "other bits for dweight")],
            "right": [Right({"rmsnorm_forward": REF, "rmsnorm_backward": "rmsnorm_backward_two_programs"}),
                      Right({"rmsnorm_forward": "rmsnorm_forward_in_column_blocks",
                             "rmsnorm_backward": "rmsnorm_backward_two_programs"})]},
        "swiglu": {
            "wrong": [Wrong({"swiglu_forward": REF, "swiglu_backward": "swiglu_backward_silu_derivative_wrong"},
                            "dgate"),
                      Wrong({"swiglu_forward": REF, "swiglu_backward": "swiglu_backward_stores_silu"}, TORCH_MEMORY),
                      Wrong({"swiglu_forward": "swiglu_forward_contiguous_only", "swiglu_backward": REF},
                            "swiglu_forward")],
            "right": [Right({"swiglu_forward": "swiglu_forward_block_256",
                             "swiglu_backward": "swiglu_backward_block_256"})]},
        "fused_gpt": {"wrong": [Wrong("use_fused_norms_only", "still has eager SwiGLU")], "right": []},
        "fusion_savings": {
            "wrong": [Wrong({"fusion_savings_per_layer": "savings_without_rstd_correction", "use_fused_kernels": REF},
                            "measured"),
                      Wrong({"fusion_savings_per_layer": "savings_counts_one_norm", "use_fused_kernels": REF},
                            "measured")],
            "right": []},
    },
    "05_flash_attention": {
        "online_softmax": {"wrong": [Wrong("softmax_stats_without_max", rf"values near 500, {SOFTMAX_SUM}"),
                                     Wrong("softmax_stats_without_rescale", rf"{SOFTMAX_SUM}: max \|error\|"),
                                     Wrong("softmax_stats_nan_on_inf_prefix", r"-inf entries \(first\), l \(the sum"),
                                     Wrong("softmax_stats_cat_logsumexp", rf"{SOFTMAX_SUM}: max \|error\|")],
                           "right": [Right("softmax_stats_cat"), Right("softmax_stats_cat_shifted_logsumexp")]},
        "attention_tiled": {"wrong": [
            # in the inputs' dtype (fp16 here) its values fail before its memory does
            Wrong("tiled_naive", r"peak extra memory .* full score matrix|float16.*, o: max \|error\|"),
            Wrong("tiled_causal_sees_next_key", r"causal.*, o: max \|error\|"),
            Wrong("tiled_causal_masks_diagonal", r"causal.*, o: .* NaN"),
            Wrong("tiled_lse_log2", r"lse \(natural log: m \+ log l\): max \|error\|"),
            Wrong("tiled_acc_not_rescaled", r", o: max \|error\|")],
                            "right": [Right("tiled_visits_every_block")]},
        "flash_forward": {"wrong": [Wrong("forward_grid_floored", "never written"),
                                    Wrong("forward_lse_log2", r"lse \(natural log: m \+ log l\): max \|error\|"),
                                    Wrong("forward_diagonal_unmasked", r"causal.*, o: max \|error\|")],
                          "right": [Right("forward_other_tiles")]},
        "flash_forward_memory": {"wrong": [Wrong("forward_with_torch", TORCH_MEMORY)],
                                 "right": [Right("forward_other_tiles")]},
        # exercise 4's three steps: delta alone, dv alone, then dk and dq with the whole backward's memory
        "flash_delta": {"wrong": [Wrong("delta_of_do_only", r", delta: max \|error\|", visible=True),
                                  Wrong("delta_in_input_dtype", r"float16.*, delta: max \|error\|", visible=True),
                                  Wrong("delta_grid_floored", r", delta: .* NaN, first at index \(\d+, \d+, \d+\): "
                                                              r"never written", visible=True),
                                  Wrong("delta_ignores_layout", r"viewed as \(B, H, N, d\).*, delta: max \|error\|",
                                        visible=True),
                                  Wrong("delta_in_torch", TORCH_MEMORY, visible=True)],
                        "right": [Right("delta_small_blocks"), Right("delta_row_blocks_per_program")]},
        "flash_backward_dv": {"wrong": [Wrong("backward_dv_before_mask", rf", dv: {MAX_ERROR}.*{DV_HINT}",
                                              visible=True),
                                        Wrong("backward_dv_scaled", rf", dv: {MAX_ERROR}.*{DV_HINT}", visible=True),
                                        Wrong("backward_dkdv_skips_tail", rf", dv: {MAX_ERROR}.*{DV_HINT}",
                                              visible=True)],
                              # right for this step: their mistakes are in delta and dq, which dv does not read
                              "right": [Right("backward_other_tiles"), Right("backward_dkdv_from_the_end"),
                                        Right("backward_delta_zero"), Right("backward_dq_unscaled")]},
        "flash_backward": {"wrong": [Wrong("backward_delta_zero", rf", dk: {MAX_ERROR}.*dv is right here",
                                           visible=True),
                                     Wrong("backward_delta_of_do_only", rf", dk: {MAX_ERROR}.*dv is right here",
                                           visible=True),
                                     Wrong("backward_dk_unscaled", rf", dk: {MAX_ERROR}.*dv is right here",
                                           visible=True),
                                     Wrong("backward_dkdv_skips_tail", rf", dk: {MAX_ERROR}.*dv is wrong here too",
                                           visible=True),
                                     Wrong("backward_dq_unscaled", rf", dq: {MAX_ERROR}.*dk is right here",
                                           visible=True),
                                     Wrong("backward_delta_in_torch", TORCH_MEMORY),
                                     Wrong("backward_dq_grid_floored", "dq: .* never written", visible=True)],
                           # backward_with_wrong_flash_delta: step 1's mistake costs step 1's point only
                           "right": [Right("backward_other_tiles"), Right("backward_dkdv_from_the_end"),
                                     Right("backward_with_wrong_flash_delta")]},
        "flash_attention_memory": {"wrong": [Wrong("attention_saves_p", "peak extra memory .* for P alone"),
                                             Wrong("attention_swaps_dk_dv", r"k\.grad: max \|error\|")],
                                   "right": [Right("attention_other_tiles")]},
    },
    "06_fused_linear_ce": {
        "cross_entropy_with_grad": {
            "wrong": [Wrong("ce_mean_over_all_tokens", r"tokens ignored\), loss: max \|error\|"),
                      Wrong("ce_grad_is_softmax", r"dlogits: max \|error\|"),
                      Wrong("ce_smoothing_only_in_loss", r"label_smoothing=0.1\), dlogits: max \|error\|"),
                      Wrong("ce_softcap_without_chain_rule", r"softcap=5.0\), dlogits: max \|error\|"),
                      Wrong("ce_nan_when_all_ignored", r"every token ignored\), loss: .* NaN")],
            "right": [Right("ce_by_autograd")]},
        "chunked_linear_ce": {
            "wrong": [Wrong("chunked_mean_per_chunk", r"ignored.*chunk_size=16\), (loss|dx|dw): max \|error\|"),
                      Wrong("chunked_all_logits_at_once", r"a tensor of .* existed during the call; the full logits"),
                      Wrong("chunked_drops_last_partial_chunk", r"(loss: max \|error\||never written)")],
            "right": [Right("chunked_in_sevens")]},
        "fused_linear_ce_forward": {
            "wrong": [Wrong("tiles_lse_of_each_tile", r"chunks=\(16, 256\)\), (loss|dx): max \|error\|"),
                      Wrong("tiles_dw_overwritten_per_chunk", r"dw: max \|error\|"),
                      Wrong("tiles_target_without_offset", r"chunks=\(16, 256\)\), dx: max \|error\|"),
                      Wrong("tiles_mean_per_chunk", r"ignored.*, (loss|dx): max \|error\|"),
                      Wrong("tiles_full_grid_last_chunk",
                            r"chunks=\(16, 300\)\): (a kernel wrote .* past the end of a tensor|your kernel loaded "
                            r".* outside every tensor)")],
            "right": [Right("tiles_other_chunks")]},
        "fused_linear_ce_memory": {
            "wrong": [Wrong("tiles_with_torch_softmax",
                            r"PyTorch computed a softmax \(.*aten\.(_softmax|logsumexp)|a tensor of")],
            "right": [Right("tiles_other_chunks")]},
        "fused_linear_cross_entropy": {
            "wrong": [Wrong("function_copies_in_backward", "peak extra memory .* a copy doubles dW"),
                      Wrong("function_ignores_grad_output", r"backward of 3.0 x loss\), x\.grad: max \|error\|")],
            "right": [Right("function_always_in_place")]},
    },
    "07_quantization": {
        # visible=True: the departures from llama.cpp that the text warns about (codes from the fp16 scale, x / d,
        # floor(v + 0.5), the tie rule) fail the visible check on its numbers, before the memory cases.
        "q8_0": {
            "wrong": [_q8("q8_truncates", r"exceeds the format's bound \S+ \(\|d\|/2 \+ 127·\|d - d̂\|"),
                      _q8("q8_scale_255", r"the scale of block \d+ is .* = fp16\(absmax / 127\)"),
                      _q8("q8_scale_from_mean", r"the scale of block \d+ is .* = fp16\(absmax / 127\)"),
                      _q8("q8_fp16_scale_codes", r"expected -?\d+: roundf.*the code the fp16 scale gives",
                          visible=True),
                      _q8("q8_divides", r"the code of x / d, which rounds differently from x · id", visible=True),
                      _q8("q8_floor_half", r"0\.00390624977.* is 1, expected 0: .*floor\(v \+ 0.5\)", visible=True),
                      _q8(REF, r"dequantized: \d+ values are NaN: never written",
                          dequantize="q8_dequantize_drops_tail"),
                      _q8("q8_in_pytorch", r"PyTorch did arithmetic")],
            "right": [Right({"quantize_q8_0": "q8_quantize_8_blocks", "dequantize_q8_0": "q8_dequantize_8_blocks"})]},
        "q4_0": {
            "wrong": [_q4("q4_interleaved", r"exceeds the format's bound \S+ \(\|d\| \+ 8·\|d - d̂\|"),
                      _q4("q4_no_clamp", r"exceeds the format's bound"),
                      _q4("q4_fp16_scale_codes", r"expected \d+: min\(15, trunc.*the code the fp16 scale gives",
                          visible=True),
                      _q4("q4_positive_wins_ties", r"both have the largest magnitude; m is the first of them",
                          visible=True),
                      _q4("q4_divides", r"the code of x / d", visible=True),
                      _q4("q4_fma", r"x · id \+ 8.5 rounded once, as an fma")],
            "right": [Right({"quantize_q4_0": "q4_quantize_8_blocks", "dequantize_q4_0": "q4_dequantize_8_blocks"})]},
        "int8_matmul": {"wrong": [Wrong("mm_one_scale_per_row", MAX_ERROR),
                                  Wrong("mm_no_k_mask", r"weight 17? ?.*max \|error\||max \|error\|"),
                                  Wrong("mm_split_k_not_zeroed", r"NaN|max \|error\|"),
                                  Wrong("mm_split_k_one_slice_launched", MAX_ERROR, visible=True),
                                  Wrong("mm_split_k_in_x_dtype", r"halves of K nearly cancel", visible=True),
                                  Wrong("mm_tile_not_rounded", r"halves of K nearly cancel", visible=True)],
                        "right": [Right("mm_other_tiles"), Right("mm_split_k_3")]},
        "int8_matmul_memory": {
            "wrong": [Wrong("mm_dequantize_then_matmul", r"a tensor of .* existed during the call; the dequantized "
                                                         r"weight|at least half the dequantized weight")],
            "right": [Right("mm_other_tiles")]},
        "blockwise": {
            "wrong": [Wrong({"quantize_blockwise": "bw_per_tensor", "dequantize_blockwise": REF},
                            r"absmax should be fp32 with one value per block of 256"),
                      Wrong({"quantize_blockwise": "bw_floor_level", "dequantize_blockwise": REF},
                            r"store the index of the nearest level"),
                      Wrong({"quantize_blockwise": REF, "dequantize_blockwise": "bw_dequantize_with_mask"},
                            r"dequantize_blockwise.*(raised|\.long\(\) it|should return)", raises=LearnerCodeError)],
            "right": [Right({"quantize_blockwise": "bw_quantize_by_distance",
                             "dequantize_blockwise": "bw_dequantize_by_take"})]},
        "adamw8bit_step": {"wrong": [Wrong("adam_no_bias_correction", r"after step 1 .* max \|error\|"),
                                     Wrong("adam_update_from_rounded_states",
                                           r"the 8-bit weight after step 1 .* max \|error\|"),
                                     Wrong("adam_never_stores_states",
                                           r"state\['m'\] after step 1.*nearer|absmax is 0"),
                                     Wrong("adam_whole_tensor", r"allocated .* over 1 byte per parameter"),
                                     Wrong("adam_l2_decay", r"after step 1 .* max \|error\|"),
                                     Wrong("adam_fp32_states", r"should hold 'm' and 'm_absmax'")],
                           "right": [Right("adam_right_by_subclass")]},
        "adamw8bit_convergence": {
            "wrong": [Wrong("adam_no_bias_correction", r"the mean loss of steps .* AdamW's is .* the margin is 2%")],
            "right": []},
    },
    "08_fine_tune": {
        # visible=True: each mistake the text warns about fails the notebook's own check cell.
        "lora_state_bytes": {
            "wrong": [Wrong("lora_bytes_unfused_gate_up", r"\['trainable'\]: expected .* w13", visible=True),
                      Wrong("lora_bytes_adapters_in_base_dtype", r"the adapters are fp32", visible=True),
                      Wrong("lora_bytes_ignores_gqa", r"grouped-query attention", visible=True),
                      Wrong("lora_bytes_grads_for_every_parameter", r"\['grads'\]: expected", visible=True),
                      Wrong("lora_bytes_adam_with_master", r"\['optimizer'\]: expected", visible=True),
                      Wrong("lora_bytes_head_in_every_block", r"\['trainable'\]: expected", visible=True),
                      Wrong("lora_bytes_no_validation", r"returned a value: raise ValueError", visible=True)],
            "right": [Right("lora_bytes_by_building")]},
        "lora_function": {
            "wrong": [Wrong("LoRANoScaleInBackward", r"d lora_a: max \|error\|.*dA = scale", visible=True),
                      Wrong("LoRAScaleSquaredInDB", r"d lora_b: max \|error\|", visible=True),
                      Wrong("LoRADxWithoutAdapter", r"dx: max \|error\|.*dx = dy W \+ scale", visible=True),
                      Wrong("LoRAFlatView", r"transposed .* raised RuntimeError: view size", raises=LearnerCodeError,
                            visible=True),
                      Wrong("LoRANoValidation", r"raise ValueError", visible=True)],
            "right": [Right("LoRAEinsum"), Right("LoRAMergedWeight"), Right("LoRASavesCopy")]},
        "lora_memory": {
            "wrong": [Wrong("LoRASavesCopy", r"the forward keeps .*that is a copy of x", visible=True),
                      Wrong("LoRAMergedWeight", r"the forward's peak .* do not form W \+ scale·B A", visible=True),
                      Wrong("LoRAAlwaysComputesDx", r"compute dx only when ctx.needs_input_grad\[0\]", visible=True),
                      Wrong("LoRAComputesDW", r"the backward's peak .* nothing of its size", visible=True)],
            "right": [Right("LoRAEinsum"), Right("LoRANoScaleInBackward")]},
        "nf4_code": {
            "wrong": [Wrong("nf4_code_symmetric", r"8 levels above zero and 8 below, NF4 has 8 and 7", visible=True),
                      Wrong("nf4_code_offset_099", r"\(published\), got", visible=True),
                      Wrong("nf4_code_float64", r"should return 16 fp32 values", visible=True),
                      Wrong("nf4_code_not_normalized", r"divide by the largest", visible=True)],
            "right": [Right("nf4_code_fp32_probabilities")]},
        "nf4": {
            "wrong": [_nf4("nf4_quantize_swapped_nibbles", "nf4_dequantize", r"the nibbles are swapped"),
                      _nf4("nf4_quantize_ties_up", "nf4_dequantize", r"exactly a midpoint, which goes to the lower"),
                      _nf4("nf4_quantize_midpoints_in_float64", "nf4_dequantize", r"exactly a midpoint"),
                      _nf4("nf4_quantize_signed_max", "nf4_dequantize", r"absmax.* expected .*max \|w\|"),
                      _nf4("nf4_quantize_zero_block_nan", "nf4_dequantize", r"should be index 7"),
                      _nf4("nf4_quantize_blocks_down_columns", "nf4_dequantize", r"absmax.* expected"),
                      _nf4("nf4_quantize_pads_ragged", "nf4_dequantize", r"not a multiple of 64 tensor returned a value"),
                      _nf4(REF, "nf4_dequantize_in_w_dtype", r"level × absmax, in fp32"),
                      _nf4(REF, "nf4_dequantize_swapped_nibbles", r"level × absmax, in fp32")],
            "right": [Right({"quantize_nf4": "nf4_quantize_by_distance", "dequantize_nf4": "nf4_dequantize_by_table"})]},
        "fake_step_memory": {
            "wrong": [Wrong("fake_step_real_tensors", r"of real tensors: build the trainer", visible=True),
                      Wrong("fake_step_trainer_outside", r"the same step on real tensors", visible=True),
                      Wrong("fake_step_trainer_built_before_fake_tensors",
                            r"given a real tensor .* Build the trainer inside: `with FakeTensors\(\): trainer = "
                            r"make_trainer\(\)`", visible=True, raises=LearnerCodeError),
                      Wrong("fake_step_first_step", r"differ from the real step's", visible=True),
                      Wrong("fake_step_forward_only", r"the same step on real tensors", visible=True),
                      Wrong("fake_step_plain_mode", r"under memfit.fake.FakeTensors", visible=True,
                            raises=LearnerCodeError)],
            "right": [Right("fake_step_meta_device")]},
        "plan": {
            "wrong": [_plan("plan_smallest_peak", REF, r"the first of PLANS, in their order"),
                      _plan("plan_strictly_below", REF, r"the first of PLANS, in their order"),
                      _plan("plan_no_headroom", REF, r"at most HEADROOM × card_bytes"),
                      _plan("plan_predicts_every_plan", REF, r"predict was called 8 times, 1 are needed"),
                      _plan("plan_returns_name", REF, r"expected \{'plan'"),
                      _plan("plan_no_validation", REF, r"returned a value: raise ValueError"),
                      _plan(REF, "tokens_every_length", r"a bisection needs at most"),
                      _plan(REF, "tokens_powers_of_two", r"most_tokens.*expected"),
                      _plan(REF, "tokens_fixed_ceiling", r"expected 768|a bisection needs at most"),
                      _plan(REF, "tokens_first_that_fails", r"most_tokens.*expected")],
            "right": [Right({"plan_fine_tune": "plan_with_next", "most_tokens": "tokens_lower_mid"})]},
    },
    "09_parallelism": {
        # visible=True: every entry but three (repeat for repeat_interleave, ring attention keeping every K/V block,
        # the planner without context parallelism: only the hidden cases have the shapes that show them) fails the
        # notebook's own check cell.
        "conjugate_ops": {
            "wrong": [_ops(r"x's gradient is wrong \(f's backward sums the gradient over ranks",
                           tp_copy="tp_copy_identity_backward"),
                      _ops(r"tp_copy.*: backward wrote into the gradient it was handed",
                           tp_copy="tp_copy_reduces_in_place"),
                      _ops(r"x's gradient is wrong \(g's backward hands the gradient on unchanged\)",
                           tp_reduce="tp_reduce_backward_all_reduce"),
                      _ops(r"tp_reduce.*: x was changed by the call", tp_reduce="tp_reduce_into_x"),
                      _ops(r"x's gradient is wrong \(the gradient of an all-gather is a reduce-scatter",
                           sp_gather="sp_gather_slices_gradient"),
                      _ops(r"bfloat16.*your code raised ValueError: all_gather: out is torch\.float32, shard is "
                           r"torch\.bfloat16", raises=LearnerCodeError, sp_gather="sp_gather_float32_buffer"),
                      _ops(r"left a tensor in ctx\.x of _GatherKeepsX\.forward", sp_gather="sp_gather_keeps_x_on_ctx"),
                      _ops(r"sp_scatter.*the collectives sent \(kind, bytes\) \[\('all_reduce', 48\)\] in forward.*"
                           r"expected \[\('reduce_scatter', 24\)\]", sp_scatter="sp_scatter_by_all_reduce"),
                      _ops(r"x's gradient is wrong \(the gradient of a reduce-scatter is an all-gather",
                           sp_scatter="sp_scatter_tiles_gradient"),
                      _ops(r"shape \(3, 3\).* returned a value: raise ValueError when dim 0 is not a multiple",
                           sp_scatter="sp_scatter_drops_tail")],
            "right": [Right({"tp_copy": "tp_copy_clone", "tp_reduce": "tp_reduce_empty_like",
                             "sp_gather": "sp_gather_flat", "sp_scatter": "sp_scatter_flat"})]},
        "shard_block": {
            "wrong": [Wrong("shard_block_chunks_wqkv", r"\['wqkv'\]: wrong values: a contiguous block of wqkv's rows "
                                                       r"mixes q, k and v heads", visible=True),
                      Wrong("shard_block_chunks_w13", r"\['w13'\]: wrong values: rank r's ffn_hidden/tp gate rows, "
                                                      r"then the same up rows", visible=True),
                      Wrong("shard_block_wo_by_rows", r"\['wo'\]: expected float32 of shape \(32, 16\), got float32 of "
                                                      r"shape \(16, 32\)", visible=True),
                      Wrong("shard_block_shares_norms", r"\['norm1'\] shares memory with params\['norm1'\]",
                            visible=True),
                      Wrong("shard_block_column_view", r"\['w2'\] is not contiguous", visible=True),
                      Wrong("shard_block_one_flat_buffer",
                            r"\['norm1'\] sits in a storage of 15,616 bytes for 128 bytes", visible=True),
                      Wrong("shard_block_wqkv_in_float32", r"\['wqkv'\]: expected bfloat16 of shape \(32, 32\), got "
                                                           r"float32", visible=True),
                      Wrong("shard_block_kv_heads_unchecked", r"2 kv heads, .*tp=4, rank=0\) returned a value: raise "
                                                              r"ValueError", visible=True),
                      Wrong("shard_block_negative_rank", r"tp=2, rank=-1\) returned a value: raise ValueError",
                            visible=True)],
            "right": [Right("shard_block_by_index"), Right("shard_block_by_heads")]},
        "tp_block": {
            "wrong": [Wrong("tp_block_norm_after_gather", r"sequence_parallel=True, rank \d: shard\['norm1'\]'s gradient "
                                                          r"\(from the rank's own tokens\)", visible=True),
                      Wrong("tp_block_rope_on_v", TP_OUTPUT, visible=True),
                      Wrong("tp_block_no_rope_on_k", TP_OUTPUT, visible=True),
                      Wrong("tp_block_kv_repeat_not_interleave",
                            r"on 1 ranks \(grouped-query.*the output: max \|error\|.*each query head with kv head "
                            r"i // \(heads / kv_heads\)"),
                      Wrong("tp_block_norm_after_copy", r"rank 0: shard\['norm1'\]'s gradient: max \|error\|",
                            visible=True),
                      Wrong("tp_block_ignores_sequence_parallel", r"sequence_parallel=True: your code raised "
                                                                  r"RuntimeError", LearnerCodeError, visible=True),
                      Wrong("tp_block_head_dim_from_d_model", r"head_dim override.*your code raised RuntimeError: "
                                                              r"split_with_sizes", LearnerCodeError, visible=True)],
            "right": [Right("tp_block_enable_gqa"), Right("tp_block_separate_projections")]},
        "tp_activation_bytes": {
            "wrong": [Wrong("activations_ignore_sp", r"sequence_parallel=True.*: expected 18,624 bytes \(the reference "
                                                     r"tp_block keeps, measured .*\), got 22,784", visible=True),
                      Wrong("activations_norms_without_rms", r"expected 22,784 bytes .*got 22,656", visible=True),
                      Wrong("activations_lse_in_dtype", r"Llama-3\.1-70B.*expected 637,800,448 bytes \(the table's "
                                                        r"count\), got 637,669,376", visible=True),
                      Wrong("activations_matmul_inputs_sharded", r"expected 18,624 bytes .*got 16,576: under sequence "
                                                                 r"parallelism", visible=True),
                      Wrong("activations_full_keeps_every_token", r"recompute='full'.*expected 512 bytes .*got 1,024: "
                                                                  r"with full recomputation", visible=True),
                      Wrong("activations_heads_not_split", r"expected 22,784 bytes .*got 26,880", visible=True),
                      Wrong("activations_accept_any_recompute", r"recompute='selective'\) returned a value: raise "
                                                                r"ValueError", visible=True),
                      Wrong("activations_korthikanti", r"expected 22,784 bytes .*got 22,528", visible=True),
                      Wrong("activations_as_float", r"returned float 22784\.0 where int is declared", visible=True)],
            "right": [Right("activations_by_tensor")]},
        "ring_attention": {
            "wrong": [Wrong("ring_accumulates_in_q_dtype", r"bfloat16, rank \d .*: dq: max \|error\|", visible=True),
                      Wrong("ring_diagonal_not_causal", RING_OUTPUT, visible=True),
                      Wrong("ring_old_not_rescaled", RING_OUTPUT, visible=True),
                      Wrong("ring_dkv_stays", RING_PASSES, visible=True),
                      Wrong("ring_dkv_one_pass_short", RING_PASSES, visible=True),
                      Wrong("ring_keeps_every_block", RING_PASSES, visible=True),
                      Wrong("ring_no_validation", r"shapes \(6, 1, 2, 8\), \(6, 1, 2, 4\).* raised RuntimeError: "
                                                  r"raise ValueError", visible=True),
                      Wrong("ring_all_gather", r"called \['all_gather'\]: pass K and V around the ring with "
                                               r"comm\.ring_pass only", visible=True)],
            "right": [Right("ring_separate_passes"), Right("ring_merge_by_max")]},
        "pipeline_schedule": {
            "wrong": [Wrong("schedule_warmup_p_minus_s", r"\['ops'\]\[0\]\[4\]: expected \('B', 0, 10\.0, 12\.0\), got "
                                                         r"\('F', 4, 4\.0, 5\.0\) \(1F1B: stage 0 runs", visible=True),
                      Wrong("schedule_gpipe_backward_reversed", r"schedule='gpipe'.*\['ops'\]\[0\]\[8\]: expected "
                                                                r"\('B', 0, .*got \('B', 7", visible=True),
                      Wrong("schedule_ignores_inputs", r"\['ops'\]\[0\]\[4\]: expected \('B', 0, 10\.0, 12\.0\), got "
                                                       r"\('B', 0, 4\.0, 6\.0\)", visible=True),
                      Wrong("schedule_total_of_last_stage", r"\['total_time'\]: expected 33, got 27\.0", visible=True),
                      Wrong("schedule_in_flight_all_forwards", r"\['in_flight'\]: expected \[4, 3, 2, 1\], got "
                                                               r"\[8, 8, 8, 8\]", visible=True),
                      Wrong("schedule_times_unchecked", r"pipeline_schedule\(3, 2, 'gpipe', 1\.0, 0\.0\) returned "
                                                        r"a value: raise ValueError \(time not positive\)",
                            visible=True)],
            "right": [Right("schedule_in_flight_by_formula"), Right("schedule_by_recursion")]},
        "memory_per_gpu": {
            "wrong": [Wrong("memory_zero_over_dp_only", r"cp=16, dp=8, zero=2.*\['grads'\]: expected 53,915,904 bytes",
                            visible=True),
                      Wrong("memory_zero2_shards_params", r"zero=2.*\['params'\]: expected 6,901,235,712 bytes",
                            visible=True),
                      Wrong("memory_without_master_copy", r"\['optimizer'\]: expected 646,990,848 bytes, got 431,327,232",
                            visible=True),
                      Wrong("memory_whole_sequence", r"seq_len=131072.*\['activations'\]: expected 5,537,009,664 "
                                                     r"bytes, got 88,592,154,624", visible=True),
                      Wrong("memory_layers_floored", r"\['activations'\]: expected 5,537,009,664 bytes, got 5,000,138,752",
                            visible=True),
                      Wrong("memory_without_sequence_parallelism", r"\['activations'\]: expected 5,537,009,664 bytes, "
                                                                   r"got 36,541,333,504", visible=True),
                      Wrong("memory_nothing_rebuilt", r"\['activations'\]: expected 5,537,009,664 bytes, got "
                                                      r"4,294,967,296", visible=True),
                      Wrong("memory_every_micro_batch_in_flight", r"\['activations'\]: expected 5,537,009,664 bytes, "
                                                                  r"got 9,831,976,960", visible=True),
                      Wrong("memory_seq_len_unchecked", r"returned a value: raise ValueError \(seq_len not a multiple "
                                                        r"of 2·cp\)", visible=True)],
            "right": [Right("memory_by_parts")]},
        "plan_parallelism": {
            "wrong": [Wrong("plan_tp_past_the_node", r"which the exercise does not allow: tp is a power of two up to "
                                                     r"gpus_per_node"),
                      Wrong("plan_fewer_micro_batches_than_stages", r"no layout fits, so return None; got .*'n_micro': 2, .*'pp': 12"),
                      Wrong("plan_least_memory", PLAN_SLOWER, visible=True),
                      Wrong("plan_ignores_memory", r"which needs 180,058,390,528 bytes per GPU \(memory_per_gpu\) on a "
                                                   r"card of 80,000,000,000", visible=True),
                      Wrong("plan_without_zero", r"returned tp=1, pp=2, cp=4, dp=1, zero=0, .*" + PLAN_SLOWER,
                            visible=True),
                      Wrong("plan_always_recomputes", r"recompute='full', .*" + PLAN_SLOWER, visible=True),
                      Wrong("plan_without_cp", r"Llama-3\.2-1B.*n_gpus=24, .*" + PLAN_SLOWER, visible=True),
                      Wrong("plan_empty_when_nothing_fits", r"no layout fits, so return None; got \{\}", visible=True)],
            "right": [Right("plan_by_min")]},
    },
}


def mutant_module(lesson: str) -> str:
    """'03_zero' -> 'tests.mutants.zero', the module whose attributes the lesson's entries name."""
    return f"tests.mutants.{topic(lesson)}"


def as_mapping(entry, uses) -> dict[str, str]:
    """An entry (Wrong, Right, or its bare `functions`) in the dict form {learner function name: mutant name or
    REF}, for a check using `uses`."""
    functions = getattr(entry, "functions", entry)
    uses = tuple(uses)
    if isinstance(functions, str):
        if len(uses) != 1:
            raise ValueError(f"entry {functions!r} names one function, but the check uses {uses}: write a dict")
        return {uses[0]: functions}
    if not isinstance(functions, dict) or set(functions) != set(uses):
        raise ValueError(f"entry {functions!r} should map exactly the check's functions {uses}")
    return {name: functions[name] for name in uses}


def mutant_names(entry) -> list[str]:
    """The mutant functions an entry names (REF left out)."""
    functions = getattr(entry, "functions", entry)
    values = [functions] if isinstance(functions, str) else list(functions.values())
    return [v for v in values if v != REF]


@functools.cache
def reference(lesson: str):
    """The lesson's reference solution as a module, loaded once per process."""
    from course.notebook_loader import load_solution
    return load_solution(lesson)


def functions_of(lesson: str, check, entry, module) -> list:
    """The functions an entry gives the check, in Check.uses order: module's attributes it names, REF the
    reference solution's own (module: the lesson's mutant module or its blind set)."""
    return [getattr(reference(lesson), name) if value == REF else getattr(module, value)
            for name, value in as_mapping(entry, check.uses).items()]


def label(entry) -> str:
    """The entry's mutants, joined by '+': its name in a test id."""
    return "+".join(mutant_names(entry))
