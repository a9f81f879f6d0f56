"""Blind set for lesson 02_activations: written from the exercise text alone (lessons/02_activations.ipynb)."""
import memfit  # noqa: F401  (first: switches Triton to its interpreter without a GPU)
import math

import torch  # noqa: F401
import triton  # noqa: F401
import triton.language as tl  # noqa: F401

from memfit.from_lessons.model_states import count_params, state_bytes
from memfit.gpt import RECOMPUTE_MODES as RECOMPUTE
from memfit.training import PRECISIONS as STEP_PRECISIONS


def dtype_bytes(precision: str) -> tuple[int, int, int]:
    """Bytes per value of (the residual stream and norms, matmul inputs and outputs, weights and gradients)."""
    if precision not in STEP_PRECISIONS:
        raise ValueError(f"precision must be one of {STEP_PRECISIONS}, not {precision!r}")
    return {"fp32": (4, 4, 4), "amp": (4, 2, 4), "bf16": (2, 2, 2)}[precision]


# ---------------------------------------------------------------------------------------------------------
# Exercise 1: activation_bytes. One parametrised core; every flag is one learner mistake.

def _act(cfg, batch, seq, precision, recompute, *, mha_as_gqa=False, rope_two=False, rope_fp32=False,
         rope_batch=False, lse_compute=False, no_inv_rms=False, sel_wqkv_h=False, full_compute=False,
         w13_f=False, weight_copies=False, fp32_no_cast=False, sel_no_lse=False):
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, not {recompute!r}")
    r, c, _ = dtype_bytes(precision)
    T, h, f, a, hd = batch * seq, cfg.d_model, cfg.ffn_hidden, cfg.n_heads, cfg.head_dim
    kv = cfg.n_kv_heads * hd
    lse = (c if lse_compute else 4) * T * a
    if recompute == "full":
        return (c if full_compute else r) * T * h
    if recompute == "selective":
        qkv_out = c * T * (h if sel_wqkv_h else h + 2 * kv)
        return r * T * h + qkv_out + c * T * h + c * T * 2 * f + c * T * h + c * T * h + (0 if sel_no_lse else lse)
    norm = 2 * r * T * h + (0 if no_inv_rms else r * T)
    mm_in = 0 if (fp32_no_cast and precision == "fp32") else c * T * h
    if precision == "fp32" and not rope_fp32:
        rope = 0
    else:
        rope = (2 if rope_two else 4) * c * seq * hd * (batch if rope_batch else 1)
    if cfg.n_kv_heads == cfg.n_heads and not mha_as_gqa:
        attn = c * T * h + c * T * kv + c * T * (h + 2 * kv) + c * T * h  # q, k, the whole q|k|v (v a view), out
    else:
        attn = 4 * c * T * h  # q, expanded k and v, out
    mlp = c * T * ((f if w13_f else 2 * f) + f + f)
    total = 2 * norm + 2 * mm_in + rope + attn + lse + mlp
    if weight_copies and precision == "amp":
        total += 2 * (h * (h + 2 * kv) + h * h + h * 2 * f + f * h)
    return total


# RIGHT: the obvious one, formula-style.
def activation_bytes_formula(cfg, batch: int, seq: int, precision: str = "amp", recompute: str = "none") -> int:
    """Bytes one block of the course GPT keeps from forward to backward (autocast weight copies excluded)."""
    return _act(cfg, batch, seq, precision, recompute)


# RIGHT: a list of the saved storages, counted one by one (a different free design: enumerate, then sum).
def activation_bytes_storage_list(cfg, batch: int, seq: int, precision: str = "amp", recompute: str = "none") -> int:
    """Bytes one block of the course GPT keeps from forward to backward (autocast weight copies excluded)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, not {recompute!r}")
    r, c, _ = dtype_bytes(precision)
    b, s, h, f = batch, seq, cfg.d_model, cfg.ffn_hidden
    a, g, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    storages = []  # (numel, bytes per value)
    block_input = (b * s * h, r)
    lse = (b * a * s, 4)
    attn_out = (b * s * a * hd, c)
    qkv_out = (b * s * (a + 2 * g) * hd, c)
    w13_out = (b * s * 2 * f, c)
    if recompute == "full":
        storages = [block_input]
    elif recompute == "selective":
        storages = [block_input, qkv_out, attn_out, lse, (b * s * h, c), w13_out, (b * s * h, c)]
    else:
        for _norm in range(2):
            storages += [(b * s * h, r), (b * s, r), (b * s * h, r), (b * s * h, c)]  # in, 1/rms, normed, cast
        if precision != "fp32":
            storages += [(s * hd, c)] * 4  # cos and sin cast for q and for k
        storages.append((b * s * a * hd, c))  # q after RoPE
        if g == a:
            storages += [(b * s * g * hd, c), qkv_out]  # k after RoPE; v views the q|k|v output
        else:
            storages += [(b * s * a * hd, c)] * 2  # expanded k and v
        storages += [attn_out, lse, w13_out, (b * s * f, c), (b * s * f, c)]
    return sum(n * nbytes for n, nbytes in storages)


def activation_bytes_mha_as_gqa(cfg, batch: int, seq: int, precision: str = "amp", recompute: str = "none") -> int:
    """Bytes one block of the course GPT keeps from forward to backward (autocast weight copies excluded)."""
    return _act(cfg, batch, seq, precision, recompute, mha_as_gqa=True)


def activation_bytes_rope_two_casts(cfg, batch: int, seq: int, precision: str = "amp", recompute: str = "none") -> int:
    """Bytes one block of the course GPT keeps from forward to backward (autocast weight copies excluded)."""
    return _act(cfg, batch, seq, precision, recompute, rope_two=True)


def activation_bytes_rope_counted_fp32(cfg, batch: int, seq: int, precision: str = "amp",
                                       recompute: str = "none") -> int:
    """Bytes one block of the course GPT keeps from forward to backward (autocast weight copies excluded)."""
    return _act(cfg, batch, seq, precision, recompute, rope_fp32=True)


def activation_bytes_rope_per_sequence(cfg, batch: int, seq: int, precision: str = "amp",
                                       recompute: str = "none") -> int:
    """Bytes one block of the course GPT keeps from forward to backward (autocast weight copies excluded)."""
    return _act(cfg, batch, seq, precision, recompute, rope_batch=True)


def activation_bytes_lse_compute_dtype(cfg, batch: int, seq: int, precision: str = "amp",
                                       recompute: str = "none") -> int:
    """Bytes one block of the course GPT keeps from forward to backward (autocast weight copies excluded)."""
    return _act(cfg, batch, seq, precision, recompute, lse_compute=True)


def activation_bytes_no_inv_rms(cfg, batch: int, seq: int, precision: str = "amp", recompute: str = "none") -> int:
    """Bytes one block of the course GPT keeps from forward to backward (autocast weight copies excluded)."""
    return _act(cfg, batch, seq, precision, recompute, no_inv_rms=True)


def activation_bytes_selective_q_only(cfg, batch: int, seq: int, precision: str = "amp",
                                      recompute: str = "none") -> int:
    """Bytes one block of the course GPT keeps from forward to backward (autocast weight copies excluded)."""
    return _act(cfg, batch, seq, precision, recompute, sel_wqkv_h=True)


def activation_bytes_selective_no_lse(cfg, batch: int, seq: int, precision: str = "amp",
                                      recompute: str = "none") -> int:
    """Bytes one block of the course GPT keeps from forward to backward (autocast weight copies excluded)."""
    return _act(cfg, batch, seq, precision, recompute, sel_no_lse=True)


def activation_bytes_full_compute_dtype(cfg, batch: int, seq: int, precision: str = "amp",
                                        recompute: str = "none") -> int:
    """Bytes one block of the course GPT keeps from forward to backward (autocast weight copies excluded)."""
    return _act(cfg, batch, seq, precision, recompute, full_compute=True)


def activation_bytes_w13_gate_only(cfg, batch: int, seq: int, precision: str = "amp", recompute: str = "none") -> int:
    """Bytes one block of the course GPT keeps from forward to backward (autocast weight copies excluded)."""
    return _act(cfg, batch, seq, precision, recompute, w13_f=True)


def activation_bytes_with_weight_copies(cfg, batch: int, seq: int, precision: str = "amp",
                                        recompute: str = "none") -> int:
    """Bytes one block of the course GPT keeps from forward to backward (autocast weight copies excluded)."""
    return _act(cfg, batch, seq, precision, recompute, weight_copies=True)


def activation_bytes_fp32_no_matmul_input(cfg, batch: int, seq: int, precision: str = "amp",
                                          recompute: str = "none") -> int:
    """Bytes one block of the course GPT keeps from forward to backward (autocast weight copies excluded)."""
    return _act(cfg, batch, seq, precision, recompute, fp32_no_cast=True)


# ---------------------------------------------------------------------------------------------------------
# Exercise 2: predict_peak. One parametrised core; every flag is one learner mistake.

def _block_matmul_weights(cfg):
    h, f, kv = cfg.d_model, cfg.ffn_hidden, cfg.n_kv_heads * cfg.head_dim
    return h * (h + 2 * kv) + h * h + h * 2 * f + f * h


def _predict(cfg, batch, seq, precision, optimizer, recompute, *, loss_temp=8, logits_compute=False,
             sgd_temp=False, no_block_copies=False, recompute_ignored=False, grads_at_loss=False,
             no_optimizer_moment=False, peak_without_temps=False, tokens_seq_only=False, last_block_only=False,
             all_blocks=False, no_head_copy=False, states_amp=False):
    if optimizer not in ("adamw", "sgd"):
        raise ValueError(f"optimizer must be 'adamw' or 'sgd', not {optimizer!r}")
    r, c, _ = dtype_bytes(precision)
    T = seq if tokens_seq_only else batch * seq
    h, f, V, L = cfg.d_model, cfg.ffn_hidden, cfg.vocab_size, cfg.n_layers
    P = count_params(cfg)
    st = state_bytes(P, "amp" if states_amp else precision, optimizer)
    mode = "none" if recompute_ignored else recompute
    if mode not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, not {recompute!r}")
    kept = _act(cfg, batch, seq, precision, mode)
    none_set = _act(cfg, batch, seq, precision, "none")
    amp = precision == "amp"
    wcopy = 0 if (no_block_copies or not amp) else 2 * _block_matmul_weights(cfg)
    lp = c if logits_compute else 4  # bytes of the log-probabilities and their gradients
    rest = (2 * r * T * h + r * T) + c * T * h + lp * T * V + 16 * T + (2 * V * h if amp and not no_head_copy else 0)
    moments = []
    loss_grads = st["grads"] if grads_at_loss else 0
    moments.append(dict(params=st["params"], grads=loss_grads, optimizer=st["optimizer"],
                        activations=L * kept + (L * wcopy if mode == "none" else 0) + rest,
                        temporaries=(2 * lp * T * V) if logits_compute else loss_temp * T * V,
                        moment="loss backward"))
    per_grad = st["grads"] // P
    block_params = _block_matmul_weights(cfg) + 2 * h
    working = none_set
    if mode == "selective":  # kept matmul outputs that the recomputed set does not hold
        working += 2 * c * T * h + (c * T * (h + 2 * cfg.n_kv_heads * cfg.head_dim)
                                    if cfg.n_kv_heads != cfg.n_heads else 0)
    indices = range(L) if all_blocks else ((L - 1,) if last_block_only else (0, L - 1))
    for i in indices:
        acts = i * kept + working - c * T * f + 8 * T + ((i + 1) * wcopy if mode == "none" else wcopy)
        grads = per_grad * ((L - 1 - i) * block_params + V * h + h + f * h)
        moments.append(dict(params=st["params"], grads=grads, optimizer=st["optimizer"], activations=acts,
                            temporaries=r * T * h + 3 * c * T * f, moment=f"backward of block {i}"))
    if cfg.tie_embeddings:  # the embedding's gradient, then its sum with the head's: both alive with the old one
        moments.append(dict(params=st["params"], grads=st["grads"], optimizer=st["optimizer"], activations=0,
                            temporaries=2 * per_grad * V * h, moment="embedding backward"))
    if not no_optimizer_moment:
        temp = st["params"] if (optimizer == "adamw" or sgd_temp) else 0
        moments.append(dict(params=st["params"], grads=st["grads"], optimizer=st["optimizer"], activations=0,
                            temporaries=temp, moment="optimizer step"))
    keys = ("params", "grads", "optimizer", "activations") + (() if peak_without_temps else ("temporaries",))
    for d in moments:
        d["peak"] = sum(d[k] for k in keys)
    best = max(moments, key=lambda d: d["peak"])
    return {k: best[k] for k in ("params", "grads", "optimizer", "activations", "temporaries", "peak", "moment")}


# RIGHT: first and last block, as the text says.
def predict_peak_first_last(cfg, batch: int, seq: int, precision: str = "amp", optimizer: str = "adamw",
                            recompute: str = "none") -> dict:
    """Peak bytes of a steady-state training step of the course GPT, by category, and the moment of the peak."""
    return _predict(cfg, batch, seq, precision, optimizer, recompute)


# RIGHT: walk every block's backward (a free choice: scan all indices instead of the two ends).
def predict_peak_every_block(cfg, batch: int, seq: int, precision: str = "amp", optimizer: str = "adamw",
                             recompute: str = "none") -> dict:
    """Peak bytes of a steady-state training step of the course GPT, by category, and the moment of the peak."""
    return _predict(cfg, batch, seq, precision, optimizer, recompute, all_blocks=True)


def predict_peak_one_logits_grad(cfg, batch: int, seq: int, precision: str = "amp", optimizer: str = "adamw",
                                 recompute: str = "none") -> dict:
    """Peak bytes of a steady-state training step of the course GPT, by category, and the moment of the peak."""
    return _predict(cfg, batch, seq, precision, optimizer, recompute, loss_temp=4)


def predict_peak_logits_compute_dtype(cfg, batch: int, seq: int, precision: str = "amp", optimizer: str = "adamw",
                                      recompute: str = "none") -> dict:
    """Peak bytes of a steady-state training step of the course GPT, by category, and the moment of the peak."""
    return _predict(cfg, batch, seq, precision, optimizer, recompute, logits_compute=True)


def predict_peak_sgd_temporary(cfg, batch: int, seq: int, precision: str = "amp", optimizer: str = "adamw",
                               recompute: str = "none") -> dict:
    """Peak bytes of a steady-state training step of the course GPT, by category, and the moment of the peak."""
    return _predict(cfg, batch, seq, precision, optimizer, recompute, sgd_temp=True)


def predict_peak_recompute_ignored(cfg, batch: int, seq: int, precision: str = "amp", optimizer: str = "adamw",
                                   recompute: str = "none") -> dict:
    """Peak bytes of a steady-state training step of the course GPT, by category, and the moment of the peak."""
    return _predict(cfg, batch, seq, precision, optimizer, recompute, recompute_ignored=True)


def predict_peak_grads_alive_at_loss(cfg, batch: int, seq: int, precision: str = "amp", optimizer: str = "adamw",
                                     recompute: str = "none") -> dict:
    """Peak bytes of a steady-state training step of the course GPT, by category, and the moment of the peak."""
    return _predict(cfg, batch, seq, precision, optimizer, recompute, grads_at_loss=True)


def predict_peak_no_optimizer_moment(cfg, batch: int, seq: int, precision: str = "amp", optimizer: str = "adamw",
                                     recompute: str = "none") -> dict:
    """Peak bytes of a steady-state training step of the course GPT, by category, and the moment of the peak."""
    return _predict(cfg, batch, seq, precision, optimizer, recompute, no_optimizer_moment=True)


def predict_peak_peak_without_temporaries(cfg, batch: int, seq: int, precision: str = "amp",
                                          optimizer: str = "adamw", recompute: str = "none") -> dict:
    """Peak bytes of a steady-state training step of the course GPT, by category, and the moment of the peak."""
    return _predict(cfg, batch, seq, precision, optimizer, recompute, peak_without_temps=True)


def predict_peak_tokens_forget_batch(cfg, batch: int, seq: int, precision: str = "amp", optimizer: str = "adamw",
                                     recompute: str = "none") -> dict:
    """Peak bytes of a steady-state training step of the course GPT, by category, and the moment of the peak."""
    return _predict(cfg, batch, seq, precision, optimizer, recompute, tokens_seq_only=True)


def predict_peak_states_always_amp(cfg, batch: int, seq: int, precision: str = "amp", optimizer: str = "adamw",
                                   recompute: str = "none") -> dict:
    """Peak bytes of a steady-state training step of the course GPT, by category, and the moment of the peak."""
    return _predict(cfg, batch, seq, precision, optimizer, recompute, states_amp=True)


predict_peak = predict_peak_first_last  # the learner's default predictor for max_micro_batch


# ---------------------------------------------------------------------------------------------------------
# Exercise 3: max_micro_batch.

def _fits(predict, cfg, seq, batch, budget_bytes, precision, optimizer, recompute, strict=False):
    peak = predict(cfg, batch, seq, precision, optimizer, recompute)["peak"]
    return peak < budget_bytes if strict else peak <= budget_bytes


# RIGHT: double until it does not fit, then bisect.
def max_micro_batch_gallop(cfg, seq: int, budget_bytes: int, precision: str = "amp", optimizer: str = "adamw",
                           recompute: str = "none", predict=None) -> int:
    """The largest batch of `seq`-token sequences whose predicted step peak is within budget_bytes (0 if none)."""
    predict = predict or predict_peak
    if not _fits(predict, cfg, seq, 1, budget_bytes, precision, optimizer, recompute):
        return 0
    lo, hi = 1, 2
    while _fits(predict, cfg, seq, hi, budget_bytes, precision, optimizer, recompute):
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # lo fits, hi does not
        mid = (lo + hi) // 2
        if _fits(predict, cfg, seq, mid, budget_bytes, precision, optimizer, recompute):
            lo = mid
        else:
            hi = mid
    return lo


# RIGHT: a linear extrapolation from batch 1 and 2 brackets the answer, then bisect (another search).
def max_micro_batch_extrapolate(cfg, seq: int, budget_bytes: int, precision: str = "amp", optimizer: str = "adamw",
                                recompute: str = "none", predict=None) -> int:
    """The largest batch of `seq`-token sequences whose predicted step peak is within budget_bytes (0 if none)."""
    predict = predict or predict_peak

    def peak(b):
        return predict(cfg, b, seq, precision, optimizer, recompute)["peak"]

    if peak(1) > budget_bytes:
        return 0
    slope = max(peak(2) - peak(1), 1)
    guess = max(1, int((budget_bytes - peak(1)) // slope) + 1)
    lo, hi = 1, guess + 1
    while peak(hi) <= budget_bytes:  # make sure hi does not fit
        lo, hi = hi, hi * 2
    if peak(guess) <= budget_bytes:
        lo = max(lo, guess)
    else:
        hi = min(hi, guess)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if peak(mid) <= budget_bytes:
            lo = mid
        else:
            hi = mid
    return lo


def max_micro_batch_one_too_many(cfg, seq: int, budget_bytes: int, precision: str = "amp", optimizer: str = "adamw",
                                 recompute: str = "none", predict=None) -> int:
    """The largest batch of `seq`-token sequences whose predicted step peak is within budget_bytes (0 if none)."""
    predict = predict or predict_peak
    if not _fits(predict, cfg, seq, 1, budget_bytes, precision, optimizer, recompute):
        return 0
    lo, hi = 1, 2
    while _fits(predict, cfg, seq, hi, budget_bytes, precision, optimizer, recompute):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits(predict, cfg, seq, mid, budget_bytes, precision, optimizer, recompute):
            lo = mid
        else:
            hi = mid
    return hi  # the first batch that does NOT fit


def max_micro_batch_strict_budget(cfg, seq: int, budget_bytes: int, precision: str = "amp", optimizer: str = "adamw",
                                  recompute: str = "none", predict=None) -> int:
    """The largest batch of `seq`-token sequences whose predicted step peak is within budget_bytes (0 if none)."""
    predict = predict or predict_peak
    if not _fits(predict, cfg, seq, 1, budget_bytes, precision, optimizer, recompute, strict=True):
        return 0
    lo, hi = 1, 2
    while _fits(predict, cfg, seq, hi, budget_bytes, precision, optimizer, recompute, strict=True):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits(predict, cfg, seq, mid, budget_bytes, precision, optimizer, recompute, strict=True):
            lo = mid
        else:
            hi = mid
    return lo


def max_micro_batch_drops_recompute(cfg, seq: int, budget_bytes: int, precision: str = "amp",
                                    optimizer: str = "adamw", recompute: str = "none", predict=None) -> int:
    """The largest batch of `seq`-token sequences whose predicted step peak is within budget_bytes (0 if none)."""
    predict = predict or predict_peak

    def fits(b):
        return predict(cfg, b, seq, precision, optimizer)["peak"] <= budget_bytes  # recompute not passed on

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def max_micro_batch_powers_of_two(cfg, seq: int, budget_bytes: int, precision: str = "amp",
                                  optimizer: str = "adamw", recompute: str = "none", predict=None) -> int:
    """The largest batch of `seq`-token sequences whose predicted step peak is within budget_bytes (0 if none)."""
    predict = predict or predict_peak
    if not _fits(predict, cfg, seq, 1, budget_bytes, precision, optimizer, recompute):
        return 0
    b = 1
    while _fits(predict, cfg, seq, 2 * b, budget_bytes, precision, optimizer, recompute):
        b *= 2
    return b  # forgot to refine between b and 2b


def max_micro_batch_capped_search(cfg, seq: int, budget_bytes: int, precision: str = "amp",
                                  optimizer: str = "adamw", recompute: str = "none", predict=None) -> int:
    """The largest batch of `seq`-token sequences whose predicted step peak is within budget_bytes (0 if none)."""
    predict = predict or predict_peak
    lo, hi = 0, 256  # "nobody trains with a micro-batch above 256"
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(predict, cfg, seq, mid, budget_bytes, precision, optimizer, recompute):
            lo = mid
        else:
            hi = mid - 1
    return lo


def max_micro_batch_at_least_one(cfg, seq: int, budget_bytes: int, precision: str = "amp",
                                 optimizer: str = "adamw", recompute: str = "none", predict=None) -> int:
    """The largest batch of `seq`-token sequences whose predicted step peak is within budget_bytes (0 if none)."""
    predict = predict or predict_peak
    lo, hi = 1, 2
    while _fits(predict, cfg, seq, hi, budget_bytes, precision, optimizer, recompute):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits(predict, cfg, seq, mid, budget_bytes, precision, optimizer, recompute):
            lo = mid
        else:
            hi = mid
    return lo  # 1 even when a single sequence does not fit


# ---------------------------------------------------------------------------------------------------------
# Exercise 4: accumulation_steps.

def _validate(micro_batch, seq, data_parallel):
    for name, value in (("micro_batch", micro_batch), ("seq", seq), ("data_parallel", data_parallel)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, not {value}")


# RIGHT: integer ceiling by negated floor division.
def accumulation_steps_negfloor(global_batch_tokens: int, micro_batch: int, seq: int, data_parallel: int = 1) -> int:
    """Micro-batches each rank accumulates so that one update covers at least global_batch_tokens."""
    _validate(micro_batch, seq, data_parallel)
    return -(-global_batch_tokens // (micro_batch * seq * data_parallel))


# RIGHT: divmod, add one for a remainder.
def accumulation_steps_divmod(global_batch_tokens: int, micro_batch: int, seq: int, data_parallel: int = 1) -> int:
    """Micro-batches each rank accumulates so that one update covers at least global_batch_tokens."""
    if micro_batch < 1 or seq < 1 or data_parallel < 1:
        raise ValueError("micro_batch, seq and data_parallel must all be at least 1")
    q, rem = divmod(global_batch_tokens, micro_batch * seq * data_parallel)
    return q + (1 if rem else 0)


def accumulation_steps_floor(global_batch_tokens: int, micro_batch: int, seq: int, data_parallel: int = 1) -> int:
    """Micro-batches each rank accumulates so that one update covers at least global_batch_tokens."""
    _validate(micro_batch, seq, data_parallel)
    return global_batch_tokens // (micro_batch * seq * data_parallel)


def accumulation_steps_ignores_ranks(global_batch_tokens: int, micro_batch: int, seq: int,
                                     data_parallel: int = 1) -> int:
    """Micro-batches each rank accumulates so that one update covers at least global_batch_tokens."""
    _validate(micro_batch, seq, data_parallel)
    return -(-global_batch_tokens // (micro_batch * seq))


def accumulation_steps_no_rank_check(global_batch_tokens: int, micro_batch: int, seq: int,
                                     data_parallel: int = 1) -> int:
    """Micro-batches each rank accumulates so that one update covers at least global_batch_tokens."""
    if micro_batch < 1 or seq < 1:
        raise ValueError("micro_batch and seq must be at least 1")
    return -(-global_batch_tokens // (micro_batch * seq * max(data_parallel, 1)))


def accumulation_steps_float_ceil(global_batch_tokens: int, micro_batch: int, seq: int,
                                  data_parallel: int = 1) -> int:
    """Micro-batches each rank accumulates so that one update covers at least global_batch_tokens."""
    _validate(micro_batch, seq, data_parallel)
    return math.ceil(global_batch_tokens / (micro_batch * seq * data_parallel))


def accumulation_steps_rounded(global_batch_tokens: int, micro_batch: int, seq: int, data_parallel: int = 1) -> int:
    """Micro-batches each rank accumulates so that one update covers at least global_batch_tokens."""
    _validate(micro_batch, seq, data_parallel)
    return max(1, round(global_batch_tokens / (micro_batch * seq * data_parallel)))


def accumulation_steps_zero_allowed(global_batch_tokens: int, micro_batch: int, seq: int,
                                    data_parallel: int = 1) -> int:
    """Micro-batches each rank accumulates so that one update covers at least global_batch_tokens."""
    if micro_batch < 0 or seq < 0 or data_parallel < 0:  # off by one: 0 slips through
        raise ValueError("micro_batch, seq and data_parallel must be positive")
    return -(-global_batch_tokens // (micro_batch * seq * data_parallel))


# ---------------------------------------------------------------------------------------------------------

BLIND = {
    "activation_bytes": {
        "wrong": [
            "activation_bytes_mha_as_gqa",
            "activation_bytes_rope_two_casts",
            "activation_bytes_rope_counted_fp32",
            "activation_bytes_rope_per_sequence",
            "activation_bytes_lse_compute_dtype",
            "activation_bytes_no_inv_rms",
            "activation_bytes_selective_q_only",
            "activation_bytes_selective_no_lse",
            "activation_bytes_full_compute_dtype",
            "activation_bytes_w13_gate_only",
            "activation_bytes_with_weight_copies",
            "activation_bytes_fp32_no_matmul_input",
        ],
        "right": ["activation_bytes_formula", "activation_bytes_storage_list"],
    },
    "predict_peak": {
        "wrong": [
            "predict_peak_one_logits_grad",
            "predict_peak_logits_compute_dtype",
            "predict_peak_sgd_temporary",
            "predict_peak_recompute_ignored",
            "predict_peak_grads_alive_at_loss",
            "predict_peak_no_optimizer_moment",
            "predict_peak_peak_without_temporaries",
            "predict_peak_tokens_forget_batch",
            "predict_peak_states_always_amp",
        ],
        "right": ["predict_peak_first_last", "predict_peak_every_block"],
    },
    "predict_peak_gpu": {
        "wrong": [
            "predict_peak_one_logits_grad",
            "predict_peak_logits_compute_dtype",
            "predict_peak_sgd_temporary",
            "predict_peak_recompute_ignored",
            "predict_peak_grads_alive_at_loss",
            "predict_peak_no_optimizer_moment",
            "predict_peak_peak_without_temporaries",
            "predict_peak_tokens_forget_batch",
            "predict_peak_states_always_amp",
        ],
        "right": ["predict_peak_first_last", "predict_peak_every_block"],
    },
    "max_micro_batch": {
        "wrong": [
            "max_micro_batch_one_too_many",
            "max_micro_batch_strict_budget",
            "max_micro_batch_drops_recompute",
            "max_micro_batch_powers_of_two",
            "max_micro_batch_capped_search",
            "max_micro_batch_at_least_one",
        ],
        "right": ["max_micro_batch_gallop", "max_micro_batch_extrapolate"],
    },
    "accumulation_steps": {
        "wrong": [
            "accumulation_steps_floor",
            "accumulation_steps_ignores_ranks",
            "accumulation_steps_no_rank_check",
            "accumulation_steps_float_ceil",
            "accumulation_steps_rounded",
            "accumulation_steps_zero_allowed",
        ],
        "right": ["accumulation_steps_negfloor", "accumulation_steps_divmod"],
    },
}

WHY = {
    # activation_bytes
    "activation_bytes_mha_as_gqa": "counts q, k, v, out as 4cTh for every model, missing that with as many K/V heads as "
                                   "query heads v is a view keeping the whole q|k|v output alive ('mind the GQA/MHA difference')",
    "activation_bytes_rope_two_casts": "counts one cos and one sin cast per block, but q and k each cast both tables "
                                       "('RoPE's casts of cos and sin are per block')",
    "activation_bytes_rope_counted_fp32": "counts RoPE tables in fp32 too, where 'the one fp32 table is shared by all "
                                          "blocks and counted nowhere'",
    "activation_bytes_rope_per_sequence": "sizes RoPE casts as batch*seq*head_dim, though the tables are (seq, 1, "
                                          "head_dim) and broadcast over the batch (hides at batch 1)",
    "activation_bytes_lse_compute_dtype": "stores the log-sum-exp in the compute dtype; the text says 'one fp32 "
                                          "log-sum-exp per query and head' (4*b*a*s bytes)",
    "activation_bytes_no_inv_rms": "forgets RMSNorm's 1/rms (one value per token) that 'each RMSNorm saves'",
    "activation_bytes_selective_q_only": "selective mode keeps the wqkv output as T*h (q only) instead of its full "
                                         "h + 2*kv width ('the outputs of the four matmuls')",
    "activation_bytes_selective_no_lse": "selective mode keeps attention's output but drops its log-sum-exp ('its "
                                         "output and log-sum-exp')",
    "activation_bytes_full_compute_dtype": "full recompute keeps the block input in the compute dtype, but the "
                                           "residual stream is fp32 under amp (hides in fp32 and bf16)",
    "activation_bytes_w13_gate_only": "counts the w13 output as f wide instead of 2f (gate and up): 'SwiGLU of width "
                                      "f saves 2f + f + f values per token'",
    "activation_bytes_with_weight_copies": "adds autocast's bf16 weight copies under amp, which the exercise says "
                                           "are 'not included'",
    "activation_bytes_fp32_no_matmul_input": "in fp32 treats the matmul input as the norm's normalized x (no separate "
                                             "tensor), but the norm output x*inv_rms*weight is a third storage",
    # predict_peak
    "predict_peak_one_logits_grad": "loss backward adds only one fp32 logits-sized tensor (4TV) instead of two "
                                    "('8·T·V more at that moment')",
    "predict_peak_logits_compute_dtype": "log-probabilities and their gradients in the compute dtype, but the loss "
                                         "runs in fp32 ('fp32 log-probabilities (4·T·V)'); hides in fp32",
    "predict_peak_sgd_temporary": "adds the foreach sqrt(v) temporary for SGD too ('SGD with momentum needs none')",
    "predict_peak_recompute_ignored": "uses the recompute='none' activations whatever the recompute argument",
    "predict_peak_grads_alive_at_loss": "counts all gradients at loss backward, though a steady-state step starts "
                                        "with grads set to None and gradients appear during backward",
    "predict_peak_no_optimizer_moment": "considers only the backward moments, forgetting the optimizer step "
                                        "(parameters + grads + states + a params-size temporary) that wins at small batch",
    "predict_peak_peak_without_temporaries": "'peak' leaves out the temporaries: it is not the sum of the categories",
    "predict_peak_tokens_forget_batch": "uses T = seq instead of batch*seq for the logits and head terms (hides at batch 1)",
    "predict_peak_states_always_amp": "calls state_bytes with 'amp' whatever the precision: bf16 states counted "
                                      "at fp32 size (hides for fp32 and amp)",
    # max_micro_batch
    "max_micro_batch_one_too_many": "bisection returns the upper bound (first batch that does not fit) instead of "
                                    "the lower one: off by one",
    "max_micro_batch_strict_budget": "peak < budget instead of <= ('within budget'): wrong exactly at the budget",
    "max_micro_batch_drops_recompute": "does not pass recompute on to predict, so it searches with no recomputation "
                                       "(hides for recompute='none')",
    "max_micro_batch_powers_of_two": "doubles while it fits and returns that power of two, forgetting to bisect "
                                     "between b and 2b",
    "max_micro_batch_capped_search": "bisects in a fixed range [0, 256]: budgets allowing more than 256 sequences "
                                     "are capped",
    "max_micro_batch_at_least_one": "returns 1 when not even one sequence fits; the text says '0 if not even one "
                                    "sequence fits'",
    # accumulation_steps
    "accumulation_steps_floor": "floor division: one update sees less than the global batch when it does not "
                                "divide ('at least the global batch')",
    "accumulation_steps_ignores_ranks": "forgets data_parallel: each rank accumulates as if it were alone (hides at 1)",
    "accumulation_steps_no_rank_check": "validates micro_batch and seq but not the rank count ('Raise ValueError for "
                                        "a micro-batch, sequence or rank count below 1')",
    "accumulation_steps_float_ceil": "math.ceil of a float division: wrong for token counts beyond 2**53",
    "accumulation_steps_rounded": "rounds to the nearest number of steps instead of up ('at least')",
    "accumulation_steps_zero_allowed": "validation checks < 0 instead of < 1: a zero slips through and raises "
                                       "ZeroDivisionError, not ValueError",
}
