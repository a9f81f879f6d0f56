"""Known-wrong (and known-right alternative) implementations of lesson 02's exercises, most of them a
single realistic mistake applied to the reference."""
from memfit.from_lessons.activations import activation_bytes as ref_activations, dtype_bytes, predict_peak as ref_peak
from memfit.from_lessons.activations import activation_bytes
from memfit.from_lessons.model_states import count_params, state_bytes


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


# One term of the prediction left out (or made up) each: the check's visible cases include one where that term
# decides the peak by more than the tolerance.
def _peak_without(cfg, batch, seq, precision="amp", optimizer="adamw", recompute="none", *, no_block_copies=False,
            no_head_copy=False, no_adam_temp=False, sgd_temp=False, temp_fp32=False, no_opt_moment=False,
            no_loss_temps=False, loss_4tv=False, blocks="both", no_recomputed=False, no_working=False,
            recompute_ignored=False, no_w2_grad=False, no_block_moments=False, no_embedding_moment=False):
    if recompute_ignored:
        recompute = "none"
    r, c, p = dtype_bytes(precision)
    T, h, f, V, L = batch * seq, cfg.d_model, cfg.ffn_hidden, cfg.vocab_size, cfg.n_layers
    kv = cfg.n_kv_heads * cfg.head_dim
    n = count_params(cfg)
    states = state_bytes(n, precision, optimizer)
    kept = activation_bytes(cfg, batch, seq, precision, recompute)
    everything = activation_bytes(cfg, batch, seq, precision, "none")
    block_weights = h * (h + 2 * kv) + h * h + 3 * h * f
    copy = 2 * block_weights if precision == "amp" and not no_block_copies else 0
    kept_copies = copy if recompute == "none" else 0
    head_copy = 2 * V * h if precision == "amp" and not no_head_copy else 0
    head = (2 * r * T * h + r * T) + c * T * h + 4 * T * V + 8 * T + 8 * T
    moments = []

    def moment(name, grads, activations, temporaries):
        moments.append({"moment": name, "params": states["params"], "grads": grads,
                        "optimizer": states["optimizer"], "activations": activations, "temporaries": temporaries})

    activations = L * kept + head
    moment("loss backward", 0, activations, L * kept_copies + head_copy + (0 if no_loss_temps else (4 if loss_4tv else 8) * T * V))
    grads = p * (V * h + h)
    activations -= head
    for block in reversed(range(L)):
        recomputed = 0 if no_recomputed else everything - kept + (copy if recompute != "none" else 0)
        if not no_block_moments and (blocks == "all" or (blocks == "both" and block in (0, L - 1)) or
                                     (blocks == "last" and block == L - 1) or (blocks == "first" and block == 0)):
            moment(f"backward of block {block}", grads + (0 if no_w2_grad else p * f * h), activations + recomputed - c * T * f,
                   (block + 1) * kept_copies + (0 if no_working else r * T * h + 3 * c * T * f))
        grads += p * (block_weights + 2 * h)
        activations -= kept
    if not no_embedding_moment:
        if cfg.tie_embeddings:
            moment("embedding backward", grads, activations, 2 * p * V * h)
        else:
            grads += p * V * h
            moment("embedding backward", grads, activations, 0)
    if not no_opt_moment:
        temp = 0
        if optimizer == "adamw" and not no_adam_temp:
            temp = 4 * n if temp_fp32 else states["params"]
        if optimizer == "sgd" and sgd_temp:
            temp = states["params"]
        moment("optimizer step", states["grads"], 0, temp)
    for m in moments:
        m["peak"] = m["params"] + m["grads"] + m["optimizer"] + m["activations"] + m["temporaries"]
    return max(moments, key=lambda m: m["peak"])


def _term(**flags):
    def predict_peak(cfg, batch, seq, precision="amp", optimizer="adamw", recompute="none"):
        return _peak_without(cfg, batch, seq, precision, optimizer, recompute, **flags)
    return predict_peak


peak_without_block_copies = _term(no_block_copies=True)
peak_without_head_copy = _term(no_head_copy=True)
peak_sgd_temporary = _term(sgd_temp=True)
peak_fp32_temporary_in_bf16 = _term(temp_fp32=True)
peak_without_optimizer_step = _term(no_opt_moment=True)
peak_one_logits_gradient = _term(loss_4tv=True)
peak_last_block_only = _term(blocks="last")
peak_first_block_only = _term(blocks="first")
peak_without_recomputed_block = _term(no_recomputed=True)
peak_without_working_gradients = _term(no_working=True)
PEAK_TERM_MUTANTS = ("peak_without_block_copies", "peak_without_head_copy", "peak_sgd_temporary",
                     "peak_fp32_temporary_in_bf16", "peak_without_optimizer_step", "peak_one_logits_gradient",
                     "peak_last_block_only", "peak_first_block_only", "peak_without_recomputed_block",
                     "peak_without_working_gradients")


def peak_every_block(cfg, batch, seq, precision="amp", optimizer="adamw", recompute="none"):  # right: all blocks
    return _peak_without(cfg, batch, seq, precision, optimizer, recompute, blocks="all")


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
