"""Blind set for lesson 01_model_states: written from the exercise text alone (lessons/01_model_states.ipynb)."""
import memfit  # noqa: F401  (first: decides TRITON_INTERPRET before triton is imported)

import math

import torch  # noqa: F401
import triton  # noqa: F401
import triton.language as tl  # noqa: F401

# Given by the notebook (the cell of Exercise 2), copied.
STATE_PRECISIONS = ("fp32", "amp", "mixed", "mixed_fp32_grads", "bf16")
STATE_OPTIMIZERS = ("adamw", "sgd", "adamw8bit")
BLOCK_8BIT = 256  # values per fp32 scale in an 8-bit optimizer state


# ---------------------------------------------------------------------------------------------
# Exercise 1: count_params
# ---------------------------------------------------------------------------------------------

def _count(cfg, *, gqa=True, tie=True, final_norm=True, layer_norms=2, norm_width=1, mlp_mats=3,
           ffn=None, pos_embed=False, kv_mats=2):
    h, L, V = cfg.d_model, cfg.n_layers, cfg.vocab_size
    head_dim = cfg.d_model // cfg.n_heads
    kv = (cfg.n_kv_heads if gqa else cfg.n_heads) * head_dim
    f = cfg.ffn_hidden if ffn is None else ffn
    attn = h * (h + kv_mats * kv) + h * h
    mlp = mlp_mats * h * f
    norms = layer_norms * h * norm_width
    per_layer = attn + mlp + norms
    emb = V * h
    head = 0 if (tie and cfg.tie_embeddings) else V * h
    total = emb + head + L * per_layer + (h * norm_width if final_norm else 0)
    if pos_embed:
        total += cfg.max_seq_len * h
    return total


# --- right ---

def count_params_tableshapes(cfg) -> int:
    """RIGHT: list every weight's shape as in the lesson's table and sum the products."""
    h, V = cfg.d_model, cfg.vocab_size
    kv = cfg.n_kv_heads * cfg.head_dim
    shapes = [(V, h)]
    for _ in range(cfg.n_layers):
        shapes += [(h,), (h, h + 2 * kv), (h, h), (h,), (h, 2 * cfg.ffn_hidden), (cfg.ffn_hidden, h)]
    shapes.append((h,))
    if not cfg.tie_embeddings:
        shapes.append((h, V))
    return sum(math.prod(s) for s in shapes)


def count_params_factored(cfg) -> int:
    """RIGHT: a closed form, computing head_dim itself and kv as d_model * n_kv_heads // n_heads."""
    h, L, V = cfg.d_model, cfg.n_layers, cfg.vocab_size
    kv = h * cfg.n_kv_heads // cfg.n_heads  # exact: n_heads divides d_model
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * cfg.ffn_hidden + 2 * h
    return V * h * (1 if cfg.tie_embeddings else 2) + L * per_layer + h


# --- wrong ---

def count_params_no_gqa(cfg) -> int:
    """K and V projections as wide as Q (h x 3h): right only for multi-head configs."""
    return _count(cfg, gqa=False)


def count_params_tie_ignored(cfg) -> int:
    """Always counts a separate head."""
    return _count(cfg, tie=False)


def count_params_no_final_norm(cfg) -> int:
    """Forgets the final RMSNorm (2L norms instead of 2L + 1)."""
    return _count(cfg, final_norm=False)


def count_params_one_norm_per_layer(cfg) -> int:
    """Counts one RMSNorm per layer instead of two."""
    return _count(cfg, layer_norms=1)


def count_params_layernorm_bias(cfg) -> int:
    """GPT-2 habit: each norm has a weight and a bias (2h)."""
    return _count(cfg, norm_width=2)


def count_params_gpt2_mlp(cfg) -> int:
    """Two MLP matrices (h x f, f x h): forgot SwiGLU's third."""
    return _count(cfg, mlp_mats=2)


def count_params_ffn_rule(cfg) -> int:
    """Uses the text's f ~ 3.5 h instead of cfg.ffn_hidden (exact for Llama-3.1-8B: 3.5 * 4096 = 14336)."""
    return _count(cfg, ffn=int(3.5 * cfg.d_model))


def count_params_pos_embed(cfg) -> int:
    """GPT-2 habit: adds a learned position embedding of max_seq_len x h (Llama uses RoPE)."""
    return _count(cfg, pos_embed=True)


def count_params_kv_shared(cfg) -> int:
    """wqkv as h x (h + kv): counts one kv width instead of two (K and V)."""
    return _count(cfg, kv_mats=1)


def count_params_float(cfg) -> int:
    """head_dim with true division: every term, and the result, is a float (values exact)."""
    h, L, V = cfg.d_model, cfg.n_layers, cfg.vocab_size
    head_dim = cfg.d_model / cfg.n_heads
    kv = cfg.n_kv_heads * head_dim
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * cfg.ffn_hidden + 2 * h
    return V * h * (1 if cfg.tie_embeddings else 2) + L * per_layer + h


def count_params_tied_drops_embed_and_head(cfg) -> int:
    """Tied: subtracts the shared matrix from a total that already counts it once (counts it zero times)."""
    total = _count(cfg, tie=False)
    if cfg.tie_embeddings:
        total -= 2 * cfg.vocab_size * cfg.d_model
    return total


# ---------------------------------------------------------------------------------------------
# Exercise 2: state_bytes
# ---------------------------------------------------------------------------------------------

def _validate(precision, optimizer):
    if precision not in STATE_PRECISIONS:
        raise ValueError(f"precision must be one of {STATE_PRECISIONS}, not {precision!r}")
    if optimizer not in STATE_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {STATE_OPTIMIZERS}, not {optimizer!r}")


def _states(n, optimizer, state_size, *, scale_ceil=True, scales_per_state=True, scale_size=4):
    if optimizer == "adamw":
        return 2 * n * state_size
    if optimizer == "sgd":
        return n * state_size
    blocks = -(-n // BLOCK_8BIT) if scale_ceil else n // BLOCK_8BIT
    return 2 * n + (2 if scales_per_state else 1) * blocks * scale_size


def _state_bytes(n, precision, optimizer, **kw):
    _validate(precision, optimizer)
    if precision in ("fp32", "amp"):
        return {"params": 4 * n, "grads": 4 * n, "optimizer": _states(n, optimizer, 4, **kw)}
    if precision == "mixed":
        return {"params": 2 * n, "grads": 2 * n, "optimizer": 4 * n + _states(n, optimizer, 4, **kw)}
    if precision == "mixed_fp32_grads":
        return {"params": 2 * n, "grads": 6 * n, "optimizer": 4 * n + _states(n, optimizer, 4, **kw)}
    return {"params": 2 * n, "grads": 2 * n, "optimizer": _states(n, optimizer, 2, **kw)}


# --- right ---

_BYTES = {  # precision: (weights, grads, master, state size)
    "fp32": (4, 4, 0, 4), "amp": (4, 4, 0, 4), "mixed": (2, 2, 4, 4),
    "mixed_fp32_grads": (2, 2 + 4, 4, 4), "bf16": (2, 2, 0, 2),
}


def state_bytes_table(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """RIGHT: table-driven; 8-bit scales with math.ceil on integers via divmod."""
    if precision not in _BYTES:
        raise ValueError(f"unknown precision {precision!r}; expected one of {tuple(_BYTES)}")
    if optimizer not in ("adamw", "sgd", "adamw8bit"):
        raise ValueError(f"unknown optimizer {optimizer!r}; expected adamw, sgd or adamw8bit")
    w, g, master, s = _BYTES[precision]
    if optimizer == "adamw8bit":
        q, r = divmod(n_params, BLOCK_8BIT)
        states = 2 * (n_params * 1 + (q + (r > 0)) * 4)
    else:
        states = (2 if optimizer == "adamw" else 1) * n_params * s
    return {"params": w * n_params, "grads": g * n_params, "optimizer": master * n_params + states}


def state_bytes_itemsize(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """RIGHT: sizes from torch dtypes' itemsize, if/elif chain, optimizer validated first."""
    if optimizer not in STATE_OPTIMIZERS:
        raise ValueError(f"bad optimizer: {optimizer!r} (choose from {STATE_OPTIMIZERS})")
    if precision not in STATE_PRECISIONS:
        raise ValueError(f"bad precision: {precision!r} (choose from {STATE_PRECISIONS})")
    f32, b16, i8 = torch.float32.itemsize, torch.bfloat16.itemsize, torch.int8.itemsize
    low = precision in ("mixed", "mixed_fp32_grads", "bf16")
    wdt = b16 if low else f32
    params = n_params * wdt
    grads = n_params * wdt + (n_params * f32 if precision == "mixed_fp32_grads" else 0)
    master = n_params * f32 if precision.startswith("mixed") else 0
    sdt = b16 if precision == "bf16" else f32
    if optimizer == "adamw":
        states = 2 * n_params * sdt
    elif optimizer == "sgd":
        states = n_params * sdt
    else:
        states = 2 * (n_params * i8 + math.ceil(n_params / BLOCK_8BIT) * f32)
    return {"params": params, "grads": grads, "optimizer": master + states}


def state_bytes_perparam(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """RIGHT: the shared helper written as one function (the obvious solution)."""
    return _state_bytes(n_params, precision, optimizer)


# --- wrong ---

def state_bytes_amp_master(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """AMP with an extra fp32 master copy in the optimizer (the notes' double count)."""
    d = _state_bytes(n_params, precision, optimizer)
    if precision == "amp":
        d["optimizer"] += 4 * n_params
    return d


def state_bytes_amp_bf16_grads(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """AMP: gradients taken to be bf16 (2 bytes) because the backward runs in bf16."""
    d = _state_bytes(n_params, precision, optimizer)
    if precision == "amp":
        d["grads"] = 2 * n_params
    return d


def state_bytes_mixed_no_master(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """Mixed recipes: forgets the fp32 master copy in "optimizer"."""
    d = _state_bytes(n_params, precision, optimizer)
    if precision.startswith("mixed"):
        d["optimizer"] -= 4 * n_params
    return d


def state_bytes_master_in_params(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """Mixed recipes: puts the fp32 master copy under "params" (totals unchanged)."""
    d = _state_bytes(n_params, precision, optimizer)
    if precision.startswith("mixed"):
        d["optimizer"] -= 4 * n_params
        d["params"] += 4 * n_params
    return d


def state_bytes_accum_in_optimizer(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """mixed_fp32_grads: the fp32 accumulator counted under "optimizer", not "grads" (totals unchanged)."""
    d = _state_bytes(n_params, precision, optimizer)
    if precision == "mixed_fp32_grads":
        d["grads"] -= 4 * n_params
        d["optimizer"] += 4 * n_params
    return d


def state_bytes_megatron_grads(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """mixed_fp32_grads: drops the bf16 gradient (Megatron's 18 bytes), grads = 4 bytes."""
    d = _state_bytes(n_params, precision, optimizer)
    if precision == "mixed_fp32_grads":
        d["grads"] = 4 * n_params
    return d


def state_bytes_bf16_fp32_states(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """bf16 recipe: optimizer states still in fp32 (the table says bf16)."""
    _validate(precision, optimizer)
    if precision == "bf16" and optimizer != "adamw8bit":
        return {"params": 2 * n_params, "grads": 2 * n_params,
                "optimizer": _states(n_params, optimizer, 4)}
    return _state_bytes(n_params, precision, optimizer)


def state_bytes_sgd_two_states(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """SGD copy-pasted from AdamW: two states instead of one momentum buffer."""
    return _state_bytes(n_params, precision, "adamw" if optimizer == "sgd" else optimizer)


def state_bytes_8bit_floor(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """8-bit scales with floor division: the partial last block gets no scale (exact for the 8B count)."""
    return _state_bytes(n_params, precision, optimizer, scale_ceil=False)


def state_bytes_8bit_one_scale_set(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """8-bit: one set of block scales for both states, not one per state."""
    return _state_bytes(n_params, precision, optimizer, scales_per_state=False)


def state_bytes_8bit_fractional(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """8-bit: bytes per parameter as a float, 2 * (1 + 4/256): fractional scales, float result."""
    _validate(precision, optimizer)
    d = _state_bytes(n_params, precision, "adamw")
    if optimizer == "adamw8bit":
        master = 4 * n_params if precision.startswith("mixed") else 0
        d["optimizer"] = master + n_params * 2 * (1 + 4 / BLOCK_8BIT)
    return d


def state_bytes_8bit_no_master(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """8-bit handled as a separate branch returning only the quantized states: mixed loses its master copy."""
    d = _state_bytes(n_params, precision, optimizer)
    if optimizer == "adamw8bit" and precision.startswith("mixed"):
        d["optimizer"] -= 4 * n_params
    return d


def state_bytes_8bit_bf16_scales(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """8-bit under bf16: the block scales stored in bf16 (2 bytes) like the rest of the recipe."""
    return _state_bytes(n_params, precision, optimizer, scale_size=2 if precision == "bf16" else 4)


def state_bytes_keyerror(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """Looks the optimizer up in a dict: an unknown optimizer raises KeyError, not ValueError."""
    if precision not in STATE_PRECISIONS:
        raise ValueError(f"precision must be one of {STATE_PRECISIONS}, not {precision!r}")
    n_states = {"adamw": 2, "sgd": 1, "adamw8bit": 2}[optimizer]
    assert n_states
    return _state_bytes(n_params, precision, optimizer)


def state_bytes_optimizer_unchecked(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """Validates precision only; optimizer by prefix: anything not starting "adamw" counts as SGD."""
    if precision not in STATE_PRECISIONS:
        raise ValueError(f"precision must be one of {STATE_PRECISIONS}, not {precision!r}")
    opt = "adamw8bit" if optimizer.endswith("8bit") else ("adamw" if optimizer.startswith("adam") else "sgd")
    return _state_bytes(n_params, precision, opt)


def state_bytes_swapped_message(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """Copy-pasted validation: a bad optimizer's ValueError names "precision"."""
    if precision not in STATE_PRECISIONS:
        raise ValueError(f"precision must be one of {STATE_PRECISIONS}, not {precision!r}")
    if optimizer not in STATE_OPTIMIZERS:
        raise ValueError(f"precision must be one of {STATE_OPTIMIZERS}, not {optimizer!r}")
    return _state_bytes(n_params, precision, optimizer)


def state_bytes_case_insensitive(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """Lower-cases the arguments first: "AMP" or "AdamW" are accepted instead of raising."""
    return _state_bytes(n_params, precision.lower(), optimizer.lower())


def state_bytes_total_key(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """Adds a "total" entry to the dict (the lesson's sum(values()) then doubles)."""
    d = _state_bytes(n_params, precision, optimizer)
    d["total"] = sum(d.values())
    return d


def state_bytes_sgd_no_momentum(n_params: int, precision: str = "amp", optimizer: str = "adamw") -> dict:
    """SGD taken as stateless (plain SGD): zero optimizer-state bytes, master copy kept."""
    d = _state_bytes(n_params, precision, optimizer)
    if optimizer == "sgd":
        d["optimizer"] -= n_params * (2 if precision == "bf16" else 4)
    return d


BLIND = {
    "count_params": {
        "wrong": ["count_params_no_gqa", "count_params_tie_ignored", "count_params_no_final_norm",
                  "count_params_one_norm_per_layer", "count_params_layernorm_bias", "count_params_gpt2_mlp",
                  "count_params_ffn_rule", "count_params_pos_embed", "count_params_kv_shared",
                  "count_params_float", "count_params_tied_drops_embed_and_head"],
        "right": ["count_params_tableshapes", "count_params_factored"],
    },
    "state_bytes": {
        "wrong": ["state_bytes_amp_master", "state_bytes_amp_bf16_grads", "state_bytes_mixed_no_master",
                  "state_bytes_master_in_params", "state_bytes_accum_in_optimizer", "state_bytes_megatron_grads",
                  "state_bytes_bf16_fp32_states", "state_bytes_sgd_two_states", "state_bytes_8bit_floor",
                  "state_bytes_8bit_one_scale_set", "state_bytes_8bit_fractional", "state_bytes_8bit_no_master",
                  "state_bytes_8bit_bf16_scales", "state_bytes_keyerror", "state_bytes_optimizer_unchecked",
                  "state_bytes_swapped_message", "state_bytes_case_insensitive", "state_bytes_total_key",
                  "state_bytes_sgd_no_momentum"],
        "right": ["state_bytes_table", "state_bytes_itemsize", "state_bytes_perparam"],
    },
    "state_bytes_measured": {
        "wrong": ["state_bytes_amp_master", "state_bytes_amp_bf16_grads", "state_bytes_bf16_fp32_states",
                  "state_bytes_sgd_two_states", "state_bytes_sgd_no_momentum"],
        "right": ["state_bytes_table", "state_bytes_itemsize", "state_bytes_perparam"],
    },
}

WHY = {
    "count_params_no_gqa": "K/V projections sized with n_heads, not n_kv_heads: ignores GQA (table: h x (h + 2*kv), kv = n_kv_heads*head_dim); right on MHA configs",
    "count_params_tie_ignored": "always counts a separate head: violates 'A tied head shares the embedding's matrix: count it once'",
    "count_params_no_final_norm": "forgets the final RMSNorm (table row 'final RMSNorm, h'): off by h",
    "count_params_one_norm_per_layer": "one RMSNorm per layer instead of norm1 and norm2 (table)",
    "count_params_layernorm_bias": "norms counted with a bias (2h): the table's norms are h each, RMSNorm has no bias",
    "count_params_gpt2_mlp": "two MLP matrices: 'SwiGLU has three matrices where a GPT-2 MLP has two'",
    "count_params_ffn_rule": "uses f = 3.5*h from the text's 'f ~ 3.5*h' instead of cfg.ffn_hidden; exact for Llama-3.1-8B only",
    "count_params_pos_embed": "adds a learned max_seq_len x h position table: not in the table (RoPE); 'from its fields only' lists no max_seq_len",
    "count_params_kv_shared": "wqkv as h x (h + kv): forgets that K and V each have width kv (h + 2*kv)",
    "count_params_float": "head_dim with '/' so the count is a float; the stub returns int and the text says cfg.head_dim is d_model // n_heads",
    "count_params_tied_drops_embed_and_head": "tied case subtracts the shared matrix twice, counting it zero times instead of once",
    "state_bytes_amp_master": "adds an fp32 master copy under amp: the text says amp's fp32 weights ARE the master weights",
    "state_bytes_amp_bf16_grads": "amp gradients taken as bf16 (2 bytes): table says amp gradients are fp32 (4)",
    "state_bytes_mixed_no_master": "mixed recipes without the fp32 master copy: 'optimizer (master copy included, for the recipes that keep one)'",
    "state_bytes_master_in_params": "master copy put under 'params' instead of 'optimizer' (same total): violates 'master copy included' in optimizer",
    "state_bytes_accum_in_optimizer": "mixed_fp32_grads accumulator booked under 'optimizer' instead of 'grads' (table: gradients bf16 (2) + fp32 accumulator (4))",
    "state_bytes_megatron_grads": "mixed_fp32_grads with grads = 4 bytes (drops the bf16 gradient): table says 2 + 4",
    "state_bytes_bf16_fp32_states": "bf16 recipe with fp32 optimizer states: table says 'states in bf16'",
    "state_bytes_sgd_two_states": "SGD counted with two states like AdamW: table says one (the momentum buffer)",
    "state_bytes_8bit_floor": "n // 256 scales: the partial last block gets no scale; exact on multiples of 256 (incl. the 8B count)",
    "state_bytes_8bit_one_scale_set": "one set of scales for both 8-bit states: text says a scale per block 'of each state'",
    "state_bytes_8bit_fractional": "8-bit bytes as n*2*(1+4/256): fractional scales for partial blocks and a float value",
    "state_bytes_8bit_no_master": "adamw8bit branch forgets the fp32 master copy of the mixed recipes",
    "state_bytes_8bit_bf16_scales": "8-bit scales stored in 2 bytes under bf16: text says one fp32 scale per block",
    "state_bytes_keyerror": "unknown optimizer raises KeyError from a dict lookup: text says raise ValueError",
    "state_bytes_optimizer_unchecked": "optimizer not validated (prefix match; unknown ones count as SGD): text says raise ValueError for an unknown optimizer",
    "state_bytes_swapped_message": "bad optimizer's ValueError names 'precision': text says 'naming the bad argument'",
    "state_bytes_case_insensitive": "lower-cases arguments, so 'AMP'/'AdamW' are accepted: not among the recipe/optimizer names, should raise ValueError",
    "state_bytes_total_key": "adds a 'total' key: the dict should hold the bytes of 'params', 'grads' and 'optimizer' (sum(values()) doubles)",
    "state_bytes_sgd_no_momentum": "SGD taken as stateless: table says '\"sgd\" (with momentum): one (the momentum buffer)'",
}
