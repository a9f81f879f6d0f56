"""Checks of lesson 01 (solutions/01_model_states.ipynb): exact parameter counts and the bytes of
parameters, gradients and optimizer states, against models built by PyTorch and measured tensors."""
from __future__ import annotations

import torch

from autograder.checks import Check, CheckFailed, call_learner, check_cases, expect_value_error
from memfit.gpt import (COURSE_CONFIGS, GPT, LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B, LLAMA_3_2_1B, GPTConfig,
                        n_params, unique_parameters)

# ------------------------------------------------------------------------------------ count_params

ODD = GPTConfig(vocab_size=1001, d_model=96, n_layers=5, n_heads=12, n_kv_heads=1, ffn_hidden=250, name="odd (MQA)")
COUNT_VISIBLE = [COURSE_CONFIGS["tiny"], LLAMA_3_1_8B]
COUNT_HIDDEN = [LLAMA_3_1_70B, LLAMA_3_1_405B, LLAMA_3_2_1B, COURSE_CONFIGS["tiny-mha"], COURSE_CONFIGS["small"],
                COURSE_CONFIGS["medium"], ODD]


def true_param_count(cfg: GPTConfig) -> int:
    """The count of the real model, built on the meta device (shapes only, no memory)."""
    with torch.device("meta"):
        return n_params(GPT(cfg))


def _count_hint(cfg: GPTConfig, diff: int) -> str:
    h, kv, L = cfg.d_model, cfg.n_kv_heads * cfg.head_dim, cfg.n_layers
    hints = {cfg.vocab_size * h: "one vocab x d_model matrix: the embedding or the output head (tied or not?)",
             (2 * L + 1) * h: "the RMSNorm weights (two per layer and a final one)",
             2 * L * h: "the two RMSNorm weights of each layer", h: "the final RMSNorm",
             2 * L * h * (h - kv): "the K and V projections: with grouped-query attention they are h x kv, "
                                   "kv = n_kv_heads * head_dim",
             L * h * cfg.ffn_hidden: "one of the three SwiGLU matrices"}
    hint = hints.get(abs(diff))
    return f" (the difference is {hint})" if hint else ""


def check_count_params(count_params, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    for cfg in (COUNT_VISIBLE if visible else []) + (COUNT_HIDDEN if hidden else []):
        got = call_learner(count_params, cfg, what=f"count_params({cfg.name})")
        want = true_param_count(cfg)
        if not isinstance(got, int) or isinstance(got, bool):
            raise CheckFailed(f"count_params({cfg.name}) should return an int, got {type(got).__name__} {got!r}")
        if got != want:
            raise CheckFailed(f"count_params({cfg.name}): expected {want:,}, got {got:,}: off by "
                              f"{got - want:+,}{_count_hint(cfg, got - want)}")


# ------------------------------------------------------------------------------------- state_bytes

def reference_state_bytes():
    from memfit.from_lessons.model_states import STATE_OPTIMIZERS, STATE_PRECISIONS, state_bytes
    return state_bytes, STATE_PRECISIONS, STATE_OPTIMIZERS


def _compare(got, want: dict, what: str, n: int) -> None:
    if not isinstance(got, dict):
        raise CheckFailed(f"{what} should return a dict with keys params, grads, optimizer; got {type(got).__name__}")
    missing = set(want) - set(got)
    if missing:
        raise CheckFailed(f"{what}: the dict lacks {sorted(missing)} (keys: params, grads, optimizer)")
    for key in want:
        if got[key] != want[key]:
            per = f" ({got[key] / n:g} bytes per parameter, expected {want[key] / n:g})" if n and isinstance(
                got[key], (int, float)) else ""
            raise CheckFailed(f"{what}[{key!r}]: expected {want[key]:,} bytes, got {got[key]!r}{per}")


def check_state_bytes(state_bytes, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    reference, precisions, optimizers = reference_state_bytes()
    n8b = true_param_count(LLAMA_3_1_8B)
    plan = []
    if visible:
        plan += [(1000, "amp", "adamw"), (n8b, "mixed", "adamw"), (12_345, "bf16", "sgd")]
    if hidden:
        plan += [(n, p, o) for n in (1, 255, 257, n8b) for p in precisions for o in optimizers]
    for n, precision, optimizer in plan:
        what = f"state_bytes({n:,}, {precision!r}, {optimizer!r})"
        _compare(call_learner(state_bytes, n, precision, optimizer, what=what), reference(n, precision, optimizer),
                 what, n)
    bad = [("fp8", "adamw"), ("amp", "adam9")] if hidden else [("fp8", "adamw")]
    for precision, optimizer in bad:
        expect_value_error(state_bytes, 1000, precision, optimizer, what=f"state_bytes(1000, {precision!r}, "
                           f"{optimizer!r})", why="for an unknown precision or optimizer")


def measured_state_bytes(cfg: GPTConfig, precision: str, optimizer: str) -> dict:
    """Bytes the trainer holds: weights and optimizer states after a step, gradients after a backward."""
    from memfit.training import Trainer, random_batch
    trainer = Trainer(cfg, precision, optimizer, device="cpu")
    idx, targets = random_batch(cfg, 2, 16, trainer.device)
    trainer.step(idx, targets)
    with trainer.autocast():
        loss = trainer.model(idx, targets)
    loss.backward()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in unique_parameters(trainer.model))
    held = trainer.state_bytes()
    return {"params": held["params"], "grads": grads, "optimizer": held["optimizer"]}


def check_state_bytes_measured(state_bytes, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    plan = []
    if visible:
        plan += [("tiny", "fp32", "adamw"), ("tiny", "amp", "adamw")]
    if hidden:
        plan += [(name, p, o) for name in ("tiny", "tiny-mha") for p in ("fp32", "amp", "bf16") for o in ("adamw", "sgd")]
    for name, precision, optimizer in plan:
        cfg = COURSE_CONFIGS[name]
        n = true_param_count(cfg)
        what = f"state_bytes({n:,}, {precision!r}, {optimizer!r}) for {cfg.name} trained on the CPU"
        _compare(call_learner(state_bytes, n, precision, optimizer, what=what),
                 measured_state_bytes(cfg, precision, optimizer), what + " (measured)", n)


CHECKS = [
    Check("count_params", 3, check_count_params, uses=("count_params",)),
    Check("state_bytes", 3, check_state_bytes, uses=("state_bytes",)),
    Check("state_bytes_measured", 2, check_state_bytes_measured, uses=("state_bytes",)),
]
