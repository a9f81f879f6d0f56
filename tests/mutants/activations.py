"""Known-wrong (and known-right alternative) implementations of lesson 02's exercises, most of them a
single realistic mistake applied to the reference."""
from memfit.from_lessons.activations import activation_bytes as ref_activations, dtype_bytes, predict_peak as ref_peak


# ---------------------------------------------------------------------------- activation_bytes
def activations_without_lse(cfg, batch, seq, precision="amp", recompute="none"):
    out = ref_activations(cfg, batch, seq, precision, recompute)
    return out if recompute == "full" else out - 4 * batch * seq * cfg.n_heads


def activations_mha_as_gqa(cfg, batch, seq, precision="amp", recompute="none"):  # misses that v keeps q|k|v alive
    out = ref_activations(cfg, batch, seq, precision, recompute)
    if cfg.n_kv_heads == cfg.n_heads and recompute == "none":
        out -= 2 * dtype_bytes(precision)[1] * batch * seq * cfg.d_model  # 3·c·T·h as with GQA, not 5·c·T·h
    return out


def activations_norms_in_half(cfg, batch, seq, precision="amp", recompute="none"):  # the residual taken as bf16
    out = ref_activations(cfg, batch, seq, precision, recompute)
    if precision == "amp" and recompute == "none":
        T, h = batch * seq, cfg.d_model
        out -= 2 * (2 * T * h + 2 * T + 2 * T * h)
    return out


def activations_full_keeps_nothing(cfg, batch, seq, precision="amp", recompute="none"):
    return 0 if recompute == "full" else ref_activations(cfg, batch, seq, precision, recompute)


def activations_selective_without_attention_output(cfg, batch, seq, precision="amp", recompute="none"):
    out = ref_activations(cfg, batch, seq, precision, recompute)
    return out - dtype_bytes(precision)[1] * batch * seq * cfg.d_model if recompute == "selective" else out


# -------------------------------------------------------------------------------- predict_peak
def peak_states_only(cfg, batch, seq, precision="amp", optimizer="adamw", recompute="none"):  # "16 bytes per param"
    out = dict(ref_peak(cfg, batch, seq, precision, optimizer, recompute))
    out.update(activations=0, temporaries=0, grads=out["params"], moment="optimizer step")
    out["peak"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def peak_without_logit_gradients(cfg, batch, seq, precision="amp", optimizer="adamw", recompute="none"):
    out = dict(ref_peak(cfg, batch, seq, precision, optimizer, recompute))
    if out["moment"] == "loss backward":
        logits = 8 * batch * seq * cfg.vocab_size
        out.update(temporaries=out["temporaries"] - logits, peak=out["peak"] - logits)
    return out


def peak_without_adam_temporary(cfg, batch, seq, precision="amp", optimizer="adamw", recompute="none"):
    out = dict(ref_peak(cfg, batch, seq, precision, optimizer, recompute))
    if out["moment"] == "optimizer step":
        out.update(peak=out["peak"] - out["temporaries"], temporaries=0)
    return out


def peak_ignores_recompute(cfg, batch, seq, precision="amp", optimizer="adamw", recompute="none"):
    return ref_peak(cfg, batch, seq, precision, optimizer, "none")


def peak_not_the_sum(cfg, batch, seq, precision="amp", optimizer="adamw", recompute="none"):
    out = dict(ref_peak(cfg, batch, seq, precision, optimizer, recompute))
    out["peak"] = out["activations"] + out["temporaries"]
    return out


# ---------------------------------------------------------------------- micro-batch, accumulation
def max_micro_batch_off_by_one(cfg, seq, budget, precision="amp", optimizer="adamw", recompute="none", predict=None):
    predict = predict or ref_peak
    batch = 1
    while predict(cfg, batch, seq, precision, optimizer, recompute)["peak"] <= budget:
        batch += 1
    return batch  # the first batch that does NOT fit


def max_micro_batch_ignores_predict(cfg, seq, budget, precision="amp", optimizer="adamw", recompute="none", predict=None):
    batch = 0
    while ref_peak(cfg, batch + 1, seq, precision, optimizer, recompute)["peak"] <= budget:
        batch += 1
    return batch


def max_micro_batch_linear_scan(cfg, seq, budget, precision="amp", optimizer="adamw", recompute="none", predict=None):
    predict = predict or ref_peak  # right, if slower than a search
    batch = 0
    while predict(cfg, batch + 1, seq, precision, optimizer, recompute)["peak"] <= budget:
        batch += 1
    return batch


def accumulation_floor(global_tokens, micro_batch, seq, data_parallel=1):
    return global_tokens // (micro_batch * seq * data_parallel)


def accumulation_ignores_ranks(global_tokens, micro_batch, seq, data_parallel=1):
    return -(-global_tokens // (micro_batch * seq))
