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
