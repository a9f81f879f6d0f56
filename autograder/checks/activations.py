"""Checks of lesson 02 (solutions/02_activations.ipynb): activation bytes per block and the peak of a
training step, predicted by the learner and measured by the course meter; micro-batch and accumulation."""
from __future__ import annotations

import torch

from autograder.checks import Check, CheckFailed, call_learner, check_cases, skip
from autograder.checks.references import reference
from memfit.gpt import COURSE_CONFIGS, GPTConfig
from memfit.meter import format_bytes
from memfit.training import Trainer, bytes_after_forward, measure_step, random_batch

# A model whose small vocabulary moves the peak away from the loss: into a block's backward (recomputation)
# or the optimizer step (short sequences).
NARROW_VOCAB = GPTConfig(vocab_size=256, d_model=128, n_layers=3, n_heads=4, n_kv_heads=2, ffn_hidden=384,
                         max_seq_len=1024, name="narrow-vocab")
CPU_CONFIGS = {"tiny": COURSE_CONFIGS["tiny"], "tiny-mha": COURSE_CONFIGS["tiny-mha"], "narrow-vocab": NARROW_VOCAB}


def _label(cfg, batch, seq, precision, recompute, optimizer=None) -> str:
    opt = f", {optimizer}" if optimizer else ""
    return f"{cfg.name}, batch {batch} x {seq}, {precision}{opt}, recompute={recompute}"


# -------------------------------------------------------------------------------- activation_bytes

def measured_block_bytes(cfg: GPTConfig, batch: int, seq: int, precision: str, recompute: str, device) -> int:
    """What one block keeps: bytes left alive by a forward pass with two blocks minus with one (autocast's
    weight copies of the second block taken out)."""
    kept = []
    for layers in (1, 2):
        trainer = Trainer(cfg.scaled(n_layers=layers), precision, recompute=recompute, device=device)
        idx, targets = random_batch(trainer.cfg, batch, seq, trainer.device)
        kept.append(bytes_after_forward(trainer, idx, targets))
    copies = 0
    if precision == "amp" and recompute == "none":
        block = trainer.model.blocks[1]
        copies = 2 * sum(m.weight.numel() for m in block.modules() if isinstance(m, torch.nn.Linear))
    return kept[1] - kept[0] - copies


def check_activation_bytes(activation_bytes, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    plan = []
    if visible:
        plan += [("tiny", 2, 64, "fp32", "none"), ("tiny", 2, 64, "amp", "none"), ("tiny", 2, 64, "fp32", "full")]
    if hidden:
        plan += [(name, b, s, p, r) for name in ("tiny", "tiny-mha") for b, s in ((3, 100), (1, 257))
                 for p in ("fp32", "amp", "bf16") for r in ("none", "selective", "full")]
    for name, batch, seq, precision, recompute in plan:
        cfg = CPU_CONFIGS[name]
        what = f"activation_bytes({_label(cfg, batch, seq, precision, recompute)})"
        got = call_learner(activation_bytes, cfg, batch, seq, precision, recompute, what=what)
        want = measured_block_bytes(cfg, batch, seq, precision, recompute, "cpu")
        if got != want:
            raise CheckFailed(f"{what}: measured {want:,} bytes kept per block (live-tensor meter, two blocks minus "
                              f"one), you predicted {got!r} ({_per_token(got, want, batch * seq, cfg.d_model)})")


def _per_token(got, want, tokens: int, h: int) -> str:
    if not isinstance(got, (int, float)):
        return "return an int"
    return f"off by {got - want:+,} bytes = {(got - want) / tokens:+g} per token = {(got - want) / (tokens * h):+g}·T·h"


# ------------------------------------------------------------------------------------ predict_peak

KEYS = ("params", "grads", "optimizer", "activations", "temporaries", "peak", "moment")


def _validate(result, what: str) -> None:
    if not isinstance(result, dict):
        raise CheckFailed(f"{what} should return a dict with keys {KEYS}, got {type(result).__name__}")
    missing = [k for k in KEYS if k not in result]
    if missing:
        raise CheckFailed(f"{what}: the dict lacks {missing}")
    if not isinstance(result["moment"], str):
        raise CheckFailed(f"{what}: 'moment' should name when the peak happens, e.g. 'loss backward'")
    parts = sum(result[k] for k in KEYS[:5])
    if parts != result["peak"]:
        raise CheckFailed(f"{what}: 'peak' ({result['peak']:,}) is not the sum of the five categories ({parts:,})")


def _check_peak(predict_peak, cfg, batch, seq, precision, optimizer, recompute, device, tolerance) -> float:
    what = f"predict_peak({_label(cfg, batch, seq, precision, recompute, optimizer)})"
    result = call_learner(predict_peak, cfg, batch, seq, precision, optimizer, recompute, what=what)
    _validate(result, what)
    def measure():
        return measure_step(Trainer(cfg, precision, optimizer, recompute, device=device), batch, seq)

    # The CUDA allocator's peak is this GPU's own: only the CPU's is the same for every student of a class.
    measured = reference(f"predict_peak {cfg!r} {batch} {seq} {precision} {optimizer} {recompute}",
                         measure) if device == "cpu" else measure()
    for key in ("params", "optimizer"):
        if result[key] != measured.states[key]:
            raise CheckFailed(f"{what}: {key!r} should be exactly the {measured.states[key]:,} bytes the trainer holds, "
                              f"got {result[key]:,}")
    error = (result["peak"] - measured.peak) / measured.peak
    if abs(error) > tolerance:
        raise CheckFailed(f"{what}: predicted peak {format_bytes(result['peak'])} at '{result['moment']}', measured "
                          f"{format_bytes(measured.peak)} ({measured.meter}): error {error:+.1%}, allowed "
                          f"±{tolerance:.0%}. Compare your categories with the measured timeline "
                          "(memfit.training.timeline) to find the moment you missed")
    return error


def check_predict_peak(predict_peak, cases: str = "visible") -> None:
    """On the CPU (live-tensor meter), whatever the machine: within 10%."""
    visible, hidden = check_cases(cases)
    plan = []
    if visible:
        plan += [("tiny", 4, 128, "fp32", "adamw", "none"), ("tiny", 4, 128, "fp32", "adamw", "full"),
                 ("tiny-mha", 2, 128, "amp", "adamw", "selective")]
    if hidden:
        plan += [(name, b, s, p, "adamw", r) for name in ("tiny", "tiny-mha", "narrow-vocab")
                 for b, s in ((2, 256), (4, 64)) for p in ("fp32", "amp") for r in ("none", "selective", "full")]
        plan += [("tiny", 3, 100, "bf16", "adamw", "none"), ("narrow-vocab", 2, 200, "fp32", "sgd", "full"),
                 ("tiny-mha", 4, 64, "bf16", "sgd", "selective")]
    for name, batch, seq, precision, optimizer, recompute in plan:
        _check_peak(predict_peak, CPU_CONFIGS[name], batch, seq, precision, optimizer, recompute, "cpu", 0.10)


# The GPU grid: two course models x three sequence lengths x with and without recomputation.
GPU_GRID = [(name, 4, seq, recompute) for name in ("small", "medium") for seq in (256, 1024, 2048)
            for recompute in ("none", "full")]


def check_predict_peak_gpu(predict_peak, cases: str = "visible") -> None:
    if not torch.cuda.is_available():
        return skip("skipped: needs a GPU (predict_peak against the CUDA allocator's peak, within 5%, "
                    "on the course's small and medium models)")
    visible, hidden = check_cases(cases)
    plan = ([("small", 4, 1024, "none")] if visible else []) + (GPU_GRID if hidden else [])
    errors = []
    for name, batch, seq, recompute in plan:
        errors.append(_check_peak(predict_peak, COURSE_CONFIGS[name], batch, seq, "amp", "adamw", recompute,
                                  "cuda", 0.05))
        torch.cuda.empty_cache()
    print(f"predict_peak on the GPU: {len(errors)} configurations, largest error {max(map(abs, errors)):.2%}")


# --------------------------------------------------------------------------------- max_micro_batch

def reference_predict_peak():
    from memfit.from_lessons.activations import predict_peak
    return predict_peak


def _largest_fitting(predict, cfg, seq, budget, precision, optimizer, recompute) -> int:
    batch = 0
    while predict(cfg, batch + 1, seq, precision, optimizer, recompute)["peak"] <= budget:
        batch += 1
    return batch


def check_max_micro_batch(max_micro_batch, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    predict = reference_predict_peak()
    tiny, medium = COURSE_CONFIGS["tiny"], COURSE_CONFIGS["medium"]
    plan = []
    if visible:
        plan += [(tiny, 128, 40 << 20, "fp32", "adamw", "none")]
    if hidden:
        plan += [(tiny, 128, 1 << 20, "fp32", "adamw", "none"),  # not even one sequence fits
                 (medium, 2048, 15 << 30, "amp", "adamw", "none"), (medium, 2048, 15 << 30, "amp", "adamw", "full"),
                 (medium, 512, 80 << 30, "amp", "adamw", "full"), (tiny, 64, 1 << 30, "bf16", "sgd", "selective")]
    for cfg, seq, budget, precision, optimizer, recompute in plan:
        what = f"max_micro_batch({cfg.name}, seq {seq}, budget {format_bytes(budget)}, {precision}, {optimizer}, {recompute})"
        got = call_learner(max_micro_batch, cfg, seq, budget, precision, optimizer, recompute, predict=predict, what=what)
        want = _largest_fitting(predict, cfg, seq, budget, precision, optimizer, recompute)
        if got != want:
            peak = lambda b: format_bytes(predict(cfg, b, seq, precision, optimizer, recompute)["peak"]) if b > 0 else "-"  # noqa: E731
            raise CheckFailed(f"{what}: expected {want} (predicted peak {peak(want)}; batch {want + 1}: "
                              f"{peak(want + 1)}), got {got!r}")
    # It must use the predictor it is given: a made-up one where each sequence costs exactly 1000 bytes.
    flat = lambda cfg, batch, seq, *args: {"peak": 1000 * batch}  # noqa: E731
    got = call_learner(max_micro_batch, tiny, 128, 12_345, "fp32", "adamw", "none", predict=flat,
                       what="max_micro_batch with a predictor where each sequence costs 1000 bytes, budget 12,345")
    if got != 12:
        raise CheckFailed(f"max_micro_batch with a predictor where each sequence costs 1000 bytes and a budget of "
                          f"12,345 bytes should return 12, got {got!r}: use the `predict` argument")


def check_accumulation_steps(accumulation_steps, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    plan = []
    if visible:
        plan += [((1920 * 32_768, 4, 4096, 8), 480), ((1000, 3, 100, 1), 4)]
    if hidden:
        plan += [((1920 * 32_768, 1, 32_768, 64), 30), ((4_000_000, 2, 2048, 16), 62), ((100, 1, 100, 1), 1),
                 ((1, 8, 8, 8), 1), ((2**20 + 1, 1, 1024, 1), 1025)]
    for args, want in plan:
        what = f"accumulation_steps{args}"
        got = call_learner(accumulation_steps, *args, what=what)
        if got != want:
            raise CheckFailed(f"{what}: expected {want} (each step covers micro_batch x seq x data_parallel = "
                              f"{args[1] * args[2] * args[3]:,} tokens; round up), got {got!r}")
    if hidden:
        for args in ((1000, 0, 100, 1), (1000, 1, 100, 0)):
            try:
                accumulation_steps(*args)
            except ValueError:
                continue
            except Exception as exc:
                raise CheckFailed(f"accumulation_steps{args} raised {type(exc).__name__}: raise ValueError") from None
            raise CheckFailed(f"accumulation_steps{args} returned a value: raise ValueError for a count below 1")


CHECKS = [
    Check("activation_bytes", 3, check_activation_bytes, uses=("activation_bytes",), timeout_s=300),
    Check("predict_peak", 4, check_predict_peak, uses=("predict_peak",), timeout_s=300, references=True),
    Check("predict_peak_gpu", 2, check_predict_peak_gpu, uses=("predict_peak",), needs_gpu=True, timeout_s=300),
    Check("max_micro_batch", 2, check_max_micro_batch, uses=("max_micro_batch",)),
    Check("accumulation_steps", 1, check_accumulation_steps, uses=("accumulation_steps",)),
]
