"""Which known-wrong and known-right implementations each graded check is proven against.

    REGISTRY[lesson][check name] = {"wrong": [entry, ...], "right": [entry, ...]}

One key per lesson 00-07 and, inside it, one key per Check of autograder/checks/<topic>.py's CHECKS (the
check's name is its nbgrader grade_id). An entry names attributes of tests/mutants/<topic>.py, the lesson's
mutant module (`mutant_module(lesson)`), that stand in for the learner functions the check is given
(Check.uses):

- a check that uses one function: the entry is the mutant's name, a string;
- a check that uses several (Check.uses has more than one name): the entry is a dict with exactly the names
  of Check.uses as keys, each mapped to a mutant's name or to "ref", the reference solution's own function
  (course.notebook_loader.load_solution(lesson), or the same code in memfit.from_lessons.<topic>). At
  least one value is a mutant. `as_mapping(entry, uses)` turns either form into the dict form.

"wrong": the check must reject it (CheckFailed: the learner loses the check's points). "right": a correct
alternative, another free design choice (block sizes, chunk sizes, loop orders, another algorithm), that
keeps the points. Every entry is proven by a test in tests/test_checks_*.py, which runs the check on it;
tests/test_mutant_registry.py verifies, without running any check, that this table covers every check of
every lesson, that every name exists, and that every name is exercised by those tests.

What the tests prove, exactly:
- GPU-only checks (Check.needs_gpu): their entries are run by tests that skip on a machine without a GPU
  (00 scaled_add_gpu: test_gpu_check_rejects_mutants / test_gpu_check_passes_alternatives; 02 predict_peak_gpu:
  test_predict_peak_on_the_gpu).
- Most entries are proven on all of the check's cases, as the grader runs it (cases="all"); a wrong entry
  proven on the visible or hidden cases only fails under "all" too (the grader stops at the first failure).
  Two right entries are proven by the suite on the visible cases only, to keep `make test` short:
  03 ZeroForeachAdamW for zero_adamw and zero_memory (its hidden cases, 29 s and 7 s on a 2-core CPU,
  passed when the registry was written).
- 03 ZeroGatherIgnoresOut (zero_adamw) used to depend on the allocator (a resized storage can come back holding
  its old bytes, and then a gather that ignores `out` went unseen: it passed on an H100 machine's CPU with torch
  2.11); memfit.zero's refill now fills the storage with NaN before the gather, so it fails everywhere.
- Not listed, though in the mutant modules: 07 q4_quantize / q4_dequantize (right numbers in PyTorch: only
  the hidden cases accept them, the visible ones reject PyTorch arithmetic, so under the grader they lose
  the points without being a "wrong" answer), and right entries for the checks where no alternative is
  proven (01 state_bytes: one formula; 07 adamw8bit_convergence: 200 training steps, 2 minutes a run).
"""
from __future__ import annotations

REF = "ref"  # in a multi-function entry: the reference solution's own function

LESSONS = ("00_first_kernel", "01_model_states", "02_activations", "03_zero", "04_kernel_fusion",
           "05_flash_attention", "06_fused_linear_ce", "07_quantization")


def _scaled_add(*wrong: str) -> dict:
    return {"wrong": list(wrong), "right": ["scaled_add_block_64", "scaled_add_block_4096"]}


REGISTRY: dict[str, dict[str, dict[str, list]]] = {
    "00_first_kernel": {
        "bytes_of": {"wrong": ["bytes_of_assumes_fp32", "bytes_of_counts_dims", "bytes_of_returns_float"],
                     "right": ["bytes_of_by_allocating"]},
        "scaled_add_numerics": _scaled_add("scaled_add_no_store_mask", "scaled_add_grid_floor",
                                           "scaled_add_alpha_on_x", "scaled_add_ignores_out"),
        "scaled_add_memory": _scaled_add("scaled_add_in_pytorch", "scaled_add_fp32_temporaries"),
        "scaled_add_gpu": _scaled_add("scaled_add_no_store_mask", "scaled_add_grid_floor", "scaled_add_alpha_on_x",
                                      "scaled_add_ignores_out", "scaled_add_in_pytorch",
                                      "scaled_add_fp32_temporaries"),
    },
    "01_model_states": {
        "count_params": {"wrong": ["count_params_always_untied", "count_params_ignores_gqa",
                                   "count_params_forgets_norms", "count_params_rule_of_thumb", "count_params_int32"],
                         "right": ["count_params_by_building"]},
        "state_bytes": {"wrong": ["state_bytes_amp_in_half", "state_bytes_no_master", "state_bytes_fp32_grads_replace",
                                  "state_bytes_8bit_without_scales", "state_bytes_accepts_anything",
                                  "state_bytes_message_without_argument", "state_bytes_case_insensitive",
                                  "state_bytes_with_total", "state_bytes_float_bytes"],
                        "right": ["state_bytes_by_table"]},
        "state_bytes_measured": {"wrong": ["state_bytes_amp_in_half"], "right": ["state_bytes_by_table"]},
    },
    "02_activations": {
        "activation_bytes": {"wrong": ["activations_without_lse", "activations_mha_as_gqa",
                                       "activations_norms_in_half", "activations_full_keeps_nothing",
                                       "activations_selective_without_attention_output"],
                             "right": []},
        "predict_peak": {"wrong": ["peak_states_only", "peak_without_logit_gradients", "peak_without_adam_temporary",
                                   "peak_ignores_recompute", "peak_not_the_sum", "peak_without_block_copies",
                                   "peak_without_head_copy", "peak_sgd_temporary", "peak_fp32_temporary_in_bf16",
                                   "peak_without_optimizer_step", "peak_one_logits_gradient", "peak_last_block_only",
                                   "peak_first_block_only", "peak_without_recomputed_block",
                                   "peak_without_working_gradients"],
                         "right": ["peak_every_block"]},
        "predict_peak_gpu": {"wrong": ["peak_without_logit_gradients"], "right": []},
        "max_micro_batch": {"wrong": ["max_micro_batch_off_by_one", "max_micro_batch_ignores_predict"],
                            "right": ["max_micro_batch_linear_scan"]},
        "accumulation_steps": {"wrong": ["accumulation_floor", "accumulation_ignores_ranks"], "right": []},
    },
    "03_zero": {
        "shard_bounds": {"wrong": ["shard_bounds_floor", "shard_bounds_off_by_one"],
                         "right": ["shard_bounds_with_math"]},
        "zero_adamw": {"wrong": ["ZeroSumsWithoutDividing", "ZeroStage1AllReduces", "ZeroGatherIgnoresOut",
                                 "ZeroAcceptsAnyStage"],
                       "right": ["ZeroForeachAdamW"]},
        "zero_memory": {"wrong": ["ZeroStage2KeepsFullGradient", "ZeroForgetsMasterInBuffers"],
                        "right": ["ZeroForeachAdamW"]},
        "zero_bytes_per_rank": {"wrong": ["zero_bytes_unpadded", "zero_bytes_stage2_shards_params"], "right": []},
        "comm_bytes_per_rank": {"wrong": ["comm_bytes_stage3_gathers_once", "comm_bytes_whole_vectors"],
                                "right": []},
        "zero_on_gloo": {"wrong": [{"ZeroAdamW": "ZeroSumsWithoutDividing", "zero_bytes_per_rank": REF},
                                   {"ZeroAdamW": REF, "zero_bytes_per_rank": "zero_bytes_stage2_shards_params"}],
                         "right": []},
        "deepspeed_estimate": {"wrong": ["estimate_16_bytes_without_offload", "estimate_without_buffer_factor"],
                               "right": []},
        "prefetch_timeline": {"wrong": ["timeline_without_memory_cap", "timeline_peak_from_depth"], "right": []},
    },
    "04_kernel_fusion": {
        "pow4_numerics": {"wrong": ["pow4_unmasked_store", "pow4_one_block_short"], "right": ["pow4_other_block"]},
        "pow4_memory": {"wrong": ["pow4_with_torch"], "right": ["pow4_other_block"]},
        "rmsnorm_forward": {"wrong": ["rmsnorm_forward_mean_not_rms", "rmsnorm_forward_rstd_in_x_dtype"],
                            "right": ["rmsnorm_forward_in_column_blocks"]},
        "rmsnorm_backward": {
            "wrong": [{"rmsnorm_forward": REF, "rmsnorm_backward": "rmsnorm_backward_without_projection"},
                      {"rmsnorm_forward": REF, "rmsnorm_backward": "rmsnorm_backward_dw_of_last_program"}],
            "right": [{"rmsnorm_forward": REF, "rmsnorm_backward": "rmsnorm_backward_row_per_program"},
                      {"rmsnorm_forward": "rmsnorm_forward_in_column_blocks",
                       "rmsnorm_backward": "rmsnorm_backward_row_per_program"}]},
        "swiglu": {
            "wrong": [{"swiglu_forward": REF, "swiglu_backward": "swiglu_backward_silu_derivative_wrong"},
                      {"swiglu_forward": REF, "swiglu_backward": "swiglu_backward_stores_silu"},
                      {"swiglu_forward": "swiglu_forward_contiguous_only", "swiglu_backward": REF}],
            "right": [{"swiglu_forward": "swiglu_forward_block_256", "swiglu_backward": "swiglu_backward_block_256"}]},
        "fused_gpt": {"wrong": ["use_fused_norms_only"], "right": []},
        "fusion_savings": {
            "wrong": [{"fusion_savings_per_layer": "savings_without_rstd_correction", "use_fused_kernels": REF},
                      {"fusion_savings_per_layer": "savings_counts_one_norm", "use_fused_kernels": REF}],
            "right": []},
    },
    "05_flash_attention": {
        "online_softmax": {"wrong": ["softmax_stats_without_max", "softmax_stats_without_rescale",
                                     "softmax_stats_nan_on_inf_prefix", "softmax_stats_cat_logsumexp"],
                           "right": ["softmax_stats_cat", "softmax_stats_cat_shifted_logsumexp"]},
        "attention_tiled": {"wrong": ["tiled_naive", "tiled_causal_sees_next_key", "tiled_causal_masks_diagonal",
                                      "tiled_lse_log2", "tiled_acc_not_rescaled"],
                            "right": ["tiled_visits_every_block"]},
        "flash_forward": {"wrong": ["forward_grid_floored", "forward_lse_log2", "forward_diagonal_unmasked"],
                          "right": ["forward_other_tiles"]},
        "flash_forward_memory": {"wrong": ["forward_with_torch"], "right": ["forward_other_tiles"]},
        "flash_backward": {"wrong": ["backward_delta_zero", "backward_delta_of_do_only", "backward_dk_unscaled",
                                     "backward_delta_in_torch", "backward_dq_grid_floored"],
                           "right": ["backward_other_tiles"]},
        "flash_attention_memory": {"wrong": ["attention_saves_p", "attention_swaps_dk_dv"],
                                   "right": ["attention_other_tiles"]},
    },
    "06_fused_linear_ce": {
        "cross_entropy_with_grad": {"wrong": ["ce_mean_over_all_tokens", "ce_grad_is_softmax",
                                              "ce_smoothing_only_in_loss", "ce_softcap_without_chain_rule",
                                              "ce_nan_when_all_ignored"],
                                    "right": ["ce_by_autograd"]},
        "chunked_linear_ce": {"wrong": ["chunked_mean_per_chunk", "chunked_all_logits_at_once",
                                        "chunked_drops_last_partial_chunk"],
                              "right": ["chunked_in_sevens"]},
        "fused_linear_ce_forward": {"wrong": ["tiles_lse_of_each_tile", "tiles_dw_overwritten_per_chunk",
                                              "tiles_target_without_offset", "tiles_mean_per_chunk",
                                              "tiles_full_grid_last_chunk"],
                                    "right": ["tiles_other_chunks"]},
        "fused_linear_ce_memory": {"wrong": ["tiles_with_torch_softmax"], "right": ["tiles_other_chunks"]},
        "fused_linear_cross_entropy": {"wrong": ["function_copies_in_backward", "function_ignores_grad_output"],
                                       "right": ["function_always_in_place"]},
    },
    "07_quantization": {
        "q8_0": {
            "wrong": [{"quantize_q8_0": "q8_truncates", "dequantize_q8_0": "q8_dequantize"},
                      {"quantize_q8_0": "q8_scale_255", "dequantize_q8_0": "q8_dequantize"},
                      {"quantize_q8_0": "q8_scale_from_mean", "dequantize_q8_0": "q8_dequantize"},
                      {"quantize_q8_0": "q8_fp16_scale_codes", "dequantize_q8_0": "q8_dequantize"},
                      {"quantize_q8_0": "q8_divides", "dequantize_q8_0": "q8_dequantize"},
                      {"quantize_q8_0": "q8_floor_half", "dequantize_q8_0": "q8_dequantize"},
                      {"quantize_q8_0": REF, "dequantize_q8_0": "q8_dequantize_drops_tail"},
                      {"quantize_q8_0": "q8_in_pytorch", "dequantize_q8_0": "q8_dequantize"}],
            "right": [{"quantize_q8_0": "q8_quantize_8_blocks", "dequantize_q8_0": "q8_dequantize_8_blocks"}]},
        "q4_0": {
            "wrong": [{"quantize_q4_0": "q4_interleaved", "dequantize_q4_0": "q4_dequantize"},
                      {"quantize_q4_0": "q4_no_clamp", "dequantize_q4_0": "q4_dequantize"},
                      {"quantize_q4_0": "q4_fp16_scale_codes", "dequantize_q4_0": "q4_dequantize"},
                      {"quantize_q4_0": "q4_positive_wins_ties", "dequantize_q4_0": "q4_dequantize"},
                      {"quantize_q4_0": "q4_divides", "dequantize_q4_0": "q4_dequantize"},
                      {"quantize_q4_0": "q4_fma", "dequantize_q4_0": "q4_dequantize"}],
            "right": [{"quantize_q4_0": "q4_quantize_8_blocks", "dequantize_q4_0": "q4_dequantize_8_blocks"}]},
        "int8_matmul": {"wrong": ["mm_one_scale_per_row", "mm_no_k_mask"], "right": ["mm_other_tiles"]},
        "int8_matmul_memory": {"wrong": ["mm_dequantize_then_matmul"], "right": ["mm_other_tiles"]},
        "blockwise": {
            "wrong": [{"quantize_blockwise": "bw_per_tensor", "dequantize_blockwise": REF},
                      {"quantize_blockwise": "bw_floor_level", "dequantize_blockwise": REF},
                      {"quantize_blockwise": REF, "dequantize_blockwise": "bw_dequantize_with_mask"}],
            "right": [{"quantize_blockwise": "bw_quantize_by_distance", "dequantize_blockwise": "bw_dequantize_by_take"}]},
        "adamw8bit_step": {"wrong": ["adam_no_bias_correction", "adam_update_from_rounded_states",
                                     "adam_never_stores_states", "adam_whole_tensor", "adam_l2_decay",
                                     "adam_fp32_states"],
                           "right": ["adam_right_by_subclass"]},
        "adamw8bit_convergence": {"wrong": ["adam_no_bias_correction"], "right": []},
    },
}


def mutant_module(lesson: str) -> str:
    """'03_zero' -> 'tests.mutants.zero', the module whose attributes the lesson's entries name."""
    return f"tests.mutants.{lesson.split('_', 1)[1]}"


def as_mapping(entry, uses) -> dict[str, str]:
    """An entry in the dict form {learner function name: mutant name or REF}, for a check using `uses`."""
    uses = tuple(uses)
    if isinstance(entry, str):
        if len(uses) != 1:
            raise ValueError(f"entry {entry!r} names one function, but the check uses {uses}: write a dict")
        return {uses[0]: entry}
    if not isinstance(entry, dict) or set(entry) != set(uses):
        raise ValueError(f"entry {entry!r} should map exactly the check's functions {uses}")
    return {name: entry[name] for name in uses}


def mutant_names(entry) -> list[str]:
    """The mutant functions an entry names (REF left out)."""
    values = [entry] if isinstance(entry, str) else list(entry.values())
    return [v for v in values if v != REF]
