"""Known-wrong (and known-right alternative) implementations of lesson 01's exercises."""
import math

import torch

from memfit.from_lessons.model_states import count_params as reference_count, state_bytes as reference_bytes


# -------------------------------------------------------------------------------- count_params
def count_params_always_untied(cfg):
    return reference_count(cfg.scaled(tie_embeddings=False))


def count_params_ignores_gqa(cfg):  # K and V as wide as Q
    return reference_count(cfg.scaled(n_kv_heads=cfg.n_heads))


def count_params_forgets_norms(cfg):
    return reference_count(cfg) - (2 * cfg.n_layers + 1) * cfg.d_model


def count_params_rule_of_thumb(cfg):
    return 12 * cfg.n_layers * cfg.d_model ** 2


def count_params_by_building(cfg):  # right: build on the meta device and count
    from memfit.gpt import GPT, n_params
    with torch.device("meta"):
        return n_params(GPT(cfg))


# --------------------------------------------------------------------------------- state_bytes
def state_bytes_amp_in_half(n, precision="amp", optimizer="adamw"):  # AMP's weights taken as 2 bytes
    out = reference_bytes(n, precision, optimizer)
    if precision == "amp":
        out = {**out, "params": 2 * n, "grads": 2 * n}
    return out


def state_bytes_no_master(n, precision="amp", optimizer="adamw"):
    out = reference_bytes(n, precision, optimizer)
    if precision.startswith("mixed"):
        out = {**out, "optimizer": out["optimizer"] - 4 * n}
    return out


def state_bytes_fp32_grads_replace(n, precision="amp", optimizer="adamw"):  # 18, not 20
    out = reference_bytes(n, precision, optimizer)
    if precision == "mixed_fp32_grads":
        out = {**out, "grads": 4 * n}
    return out


def state_bytes_8bit_without_scales(n, precision="amp", optimizer="adamw"):
    out = reference_bytes(n, precision, optimizer)
    if optimizer == "adamw8bit":
        out = {**out, "optimizer": out["optimizer"] - 8 * math.ceil(n / 256)}
    return out


def state_bytes_accepts_anything(n, precision="amp", optimizer="adamw"):
    try:
        return reference_bytes(n, precision, optimizer)
    except ValueError:
        return reference_bytes(n, "amp", "adamw")


# Issue 24: the families a blind tester's set slipped through (a validation message naming the wrong argument,
# case-insensitive names, an extra key, float bytes) and a count wrapped to int32.
def count_params_int32(cfg):  # the count computed in a 32-bit integer: wraps above 2**31 - 1
    return (reference_count(cfg) + 2**31) % 2**32 - 2**31


def state_bytes_message_without_argument(n, precision="amp", optimizer="adamw"):  # "unknown 'adam9'": which one?
    try:
        return reference_bytes(n, precision, optimizer)
    except ValueError:
        raise ValueError(f"unknown value: {precision!r} / {optimizer!r}") from None


def state_bytes_case_insensitive(n, precision="amp", optimizer="adamw"):  # "AMP" taken for "amp"
    return reference_bytes(n, precision.lower(), optimizer.lower())


def state_bytes_with_total(n, precision="amp", optimizer="adamw"):  # a fourth key: sum(values()) doubles
    out = reference_bytes(n, precision, optimizer)
    return {**out, "total": sum(out.values())}


def state_bytes_float_bytes(n, precision="amp", optimizer="adamw"):  # right values, as floats (true division)
    return {key: value / 1 for key, value in reference_bytes(n, precision, optimizer).items()}


def state_bytes_by_table(n_params, precision="amp", optimizer="adamw"):  # right: a table, "recipe" in the message
    weights = {"fp32": (4, 4, 0, 4), "amp": (4, 4, 0, 4), "mixed": (2, 2, 4, 4), "mixed_fp32_grads": (2, 6, 4, 4),
               "bf16": (2, 2, 0, 2)}  # weight, gradient, master, one optimizer-state value
    if precision not in weights:
        raise ValueError(f"unknown recipe {precision!r}")
    if optimizer not in ("adamw", "sgd", "adamw8bit"):
        raise ValueError(f"unknown optimizer {optimizer!r}")
    weight, grad, master, state = weights[precision]
    states = {"adamw": 2 * state * n_params, "sgd": state * n_params,
              "adamw8bit": 2 * (n_params + 4 * (-(-n_params // 256)))}[optimizer]
    return {"params": weight * n_params, "grads": grad * n_params, "optimizer": master * n_params + states}
