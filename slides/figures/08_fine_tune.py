"""Lesson 08's deck: a full fine-tune's states against the cards, LoRA's bytes (the lesson's lora_state_bytes), what
the LoRA function keeps (measured here on the course's meter), NF4's levels and its error against Q4_0 (measured
here), and Llama-3.1-8B's step on fake tensors (the lesson's fake_step_memory) against lesson 02's formula."""
from __future__ import annotations

import torch

from autograder.checks.fine_tune import CHECKS
from memfit.from_lessons.activations import predict_peak
from memfit.from_lessons.model_states import count_params, state_bytes
from memfit.from_lessons.quantization import dequantize_q4_0, quantize_q4_0
from memfit.gpt import LLAMA_3_1_8B as L8
from memfit.hardware import KNOWN_GPUS, profile_for
from memfit.meter import LIVE_TENSORS, measure_peak, open_meter
from memfit.training import Trainer
from slides.figures import COLORS, figure, gib, lesson, markdown_table, measured_on, pct, record, source  # noqa: F401

ref = lesson("08_fine_tune")
pts = {c.name: c.points for c in CHECKS}
n8 = count_params(L8)
GB = 1e9

# --- a full fine-tune against the cards
RECIPES = (("amp", "adamw", "fp32 weights under autocast, AdamW"), ("bf16", "adamw", "bf16 weights and states, AdamW"),
           ("bf16", "adamw8bit", "bf16 weights, 8-bit AdamW (lesson 07)"))
full_bytes = {what: state_bytes(n8, p, o) for p, o, what in RECIPES}  # lesson 01: params, grads, optimizer
# states, as the lesson defines them: parameters and optimizer state; the gradients live within a step only
full_states = {what: b["params"] + b["optimizer"] for what, b in full_bytes.items()}
full_grads = {what: b["grads"] for what, b in full_bytes.items()}
cards = {spec["gpu_name"]: spec["total_memory"] for spec in KNOWN_GPUS.values()}
full_table = markdown_table(["recipe (Llama-3.1-8B)", "B/param", "states (params + optimizer)", "gradients",
                             "states + gradients"],
                            [[what, f"{(b + full_grads[what]) / n8:.2f}", gib(b), gib(full_grads[what]),
                              gib(b + full_grads[what])] for what, b in full_states.items()])
cards_line = ", ".join(f"{name.replace('NVIDIA ', '')} {gib(b, 0)}" for name, b in cards.items())

# --- LoRA's bytes (exercise 1)
lora_rows = {r: ref.lora_state_bytes(L8, r) for r in (8, 16, 64)}
lora_table = markdown_table(["r", "trainable", "share", "adapters + grads + AdamW", "states (params + optimizer)",
                             "states + gradients"],
                            [[r, f"{s['trainable']:,}", pct(s["trainable"] / n8, 2),
                              gib(12 * s["trainable"] + 4 * s["trainable"], 2), gib(s["params"] + s["optimizer"]),
                              gib(s["params"] + s["grads"] + s["optimizer"])] for r, s in lora_rows.items()])
h, f, kv = L8.d_model, L8.ffn_hidden, L8.n_kv_heads * L8.head_dim
shapes = {"wqkv": (h, h + 2 * kv), "wo": (h, h), "w13": (h, 2 * f), "w2": (f, h)}
shape_table = markdown_table(["target", "d_in × d_out", "r·(d_in + d_out), r = 16", "of the matrix"],
                             [[f"`{t}`", f"{i:,} × {o:,}", f"{16 * (i + o):,}", pct(16 * (i + o) / (i * o), 2)]
                              for t, (i, o) in shapes.items()])


# --- what the LoRA function keeps: the lesson's LoRAFunction against autograd's composite and a merged weight
def _lora_memory() -> dict:
    tokens, d_in, d_out, r = 64, 1024, 1024, 16
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, d_in, generator=gen).requires_grad_()
    w = torch.randn(d_out, d_in, generator=gen) / 32
    a = (torch.randn(r, d_in, generator=gen) / 32).requires_grad_()
    b = torch.randn(d_out, r, generator=gen).requires_grad_()
    dy = torch.randn(tokens, d_out, generator=gen)
    ways = {"LoRAFunction (exercise 2)": lambda: ref.LoRAFunction.apply(x, w, a, b, 2.0),
            "autograd on x Wᵀ + s (x Aᵀ) Bᵀ": lambda: x @ w.t() + 2.0 * ((x @ a.t()) @ b.t()),
            "merged: x (W + s B A)ᵀ": lambda: x @ (w + 2.0 * (b @ a)).t()}
    out = {}
    for name, fn in ways.items():
        with open_meter("cpu", LIVE_TENSORS) as meter:
            y = fn()
            forward_peak, kept = meter.peak, meter.current - y.untyped_storage().nbytes()
        _, report = measure_peak(lambda: y.backward(dy, retain_graph=True), meter=LIVE_TENSORS, warmup=False)
        out[name] = {"kept": kept, "forward": forward_peak, "backward": report.peak_bytes}
        x.grad = a.grad = b.grad = None
    return {"shape": (tokens, d_in, d_out, r), "weight": d_out * d_in * 4, "rows": out}


lm = _lora_memory()
lora_memory_table = markdown_table(["implementation", "kept for backward", "forward peak", "backward peak"],
                                   [[name, f"{v['kept'] / 1024:,.0f} KiB", f"{v['forward'] / 1024:,.0f} KiB",
                                     f"{v['backward'] / 1024:,.0f} KiB"] for name, v in lm["rows"].items()])


# --- NF4
code = ref.nf4_code()
gen = torch.Generator().manual_seed(0)
w_demo = torch.randn(256, 1024, generator=gen) * 0.02
q = ref.quantize_nf4(w_demo)
codes2, absmax2, mean = ref.double_quantize(q.absmax)
dq_bits = 8 * (q.codes.numel() + codes2.numel() + 4 * absmax2.numel() + 4) / w_demo.numel()


def _rel(w_hat) -> float:
    return ((w_hat.float() - w_demo).norm() / w_demo.norm()).item()


nf4_err = _rel(ref.dequantize_nf4(q))
nf4_dq_err = _rel(ref.dequantize_nf4(ref.NF4(q.codes, ref.double_dequantize(codes2, absmax2, mean, q.absmax.shape),
                                             q.shape, q.dtype)))
q4_err = _rel(dequantize_q4_0(quantize_q4_0(w_demo)).view_as(w_demo))
matrices = L8.n_layers * h * (2 * h + 2 * kv + 3 * f)
qlora_base = matrices * dq_bits / 8 + 2 * (n8 - matrices)


def fig_nf4_levels():
    """NF4's 16 levels and Q4_0's (for a block whose largest value is +1) on the standard normal's density."""
    fig, ax = figure(figsize=(9, 3.4))
    xs = torch.linspace(-1.05, 1.05, 400)
    density = torch.exp(-(xs * 1.848) ** 2 / 2)  # N(0, 1) scaled as NF4 scales it (its top level is Φ⁻¹(δ))
    ax.fill_between(xs, 0, density, color=COLORS["peer"], alpha=0.25, label="normal density (NF4's scale)")
    ax.vlines(code, 0, 1.05, color=COLORS["ours"], lw=2, label="NF4: 16 normal quantiles, 0 exact")
    q4_levels = [(k - 8) / -8 for k in range(16)]  # Q4_0 with d = m / -8, m = +1: levels (q - 8) · d
    ax.vlines(q4_levels, -0.25, 0, color=COLORS["activations"], lw=2, label="Q4_0: 16 evenly spaced (d = m / −8)")
    ax.set(xlim=(-1.1, 1.1), yticks=[], xlabel="value / block absmax")
    ax.legend(loc="upper left", fontsize=10)
    return fig


# --- fake tensors: Llama-3.1-8B at one sequence of 4,096 tokens
batch, seq = 1, 4096
FAKE_RECIPES = {"full: amp, AdamW": (lambda: Trainer(L8, "amp", "adamw", "none", "cpu"), ("amp", "none")),
                "full: bf16, AdamW, full recomputation": (lambda: Trainer(L8, "bf16", "adamw", "full", "cpu"),
                                                          ("bf16", "full")),
                "LoRA r=16, bf16 base": (lambda: ref.lora_trainer(L8, 16, device="cpu"), None),
                "LoRA r=16, bf16 base, full recomputation": (lambda: ref.lora_trainer(L8, 16, recompute="full",
                                                                                      device="cpu"), None),
                "QLoRA r=16, NF4 base": (lambda: ref.qlora_trainer(L8, 16, device="cpu"), None),
                "QLoRA r=16, NF4 base, full recomputation": (lambda: ref.qlora_trainer(L8, 16, recompute="full",
                                                                                        device="cpu"), None)}
fake_rows = []
for name, (make, formula) in FAKE_RECIPES.items():
    step = ref.fake_step_memory(make, batch, seq)
    predicted = predict_peak(L8, batch, seq, formula[0], "adamw", formula[1])["peak"] if formula else None
    fake_rows.append([name, gib(step.peak, 2), gib(predicted, 2) if predicted else "(not in lesson 02)",
                      f"{step.peak / predicted - 1:+.2%}" if predicted else "—"])
fake_table = markdown_table(["recipe", "fake tensors (this machine)", "lesson 02's formula", "difference"], fake_rows)
where = measured_on()

# --- the H100 record: the same plans, predicted on the GPU's device and measured by its allocator
h100 = record("fine_tune", file="h100")


def _longest(row, name: str, key: str) -> str:
    """The most tokens a plan is predicted to fit, and what a real step there measured against the prediction."""
    tokens, peak = row[f"most_tokens {name}"], row.get(f"{key}: measured bytes at that length")
    if not tokens or peak is None:
        return f"{tokens:,}" + (" (out of memory)" if row.get(f"{key}: a real step at that length") is False else "")
    predicted = h100["fine_tune"]["predicted"][row["recipe"]][str(tokens)]
    return f"{tokens:,} ({predicted / peak - 1:+.2%})"


_longest_80 = {r["recipe"]: r["most_tokens this card"] for r in h100["fine_tune"]["rows"]}
# the full plan with the course's kernels, against the record's contrast row (the one plan not in PLANS: the same
# plan with PyTorch's attention and loss)
_contrast = next((p for p in _longest_80 if p not in ref.PLANS), None)  # a newer record may have none
kernels_gain = (f"{_longest_80[ref.PLANS[1]] // _longest_80[_contrast]}" if _contrast is not None
                else "several")

h100_table = markdown_table(
    ["plan", "predicted", "measured (error)", "ms / step", "most tokens: T4 15 GiB", "most tokens: 80 GB"],
    [[r["recipe"], gib(r["predicted_bytes"], 2),
      "not run (over the card)" if r["measured_bytes"] is None else f"{gib(r['measured_bytes'], 2)} ({r['error']:+.2%})",
      "—" if r["step_ms"] is None else f"{r['step_ms']:,.0f}",
      _longest(r, "T4 (15 GiB)", "T4 cap"), _longest(r, "this card", "this card")] for r in h100["fine_tune"]["rows"]])


# --- exercise 6: the lesson's plan_fine_tune on the H100 record's predictions (one sequence of 4,096 tokens)
_recorded = {p: by_seq for p, by_seq in h100["fine_tune"]["predicted"].items()}


def _recorded_peak(plan, cfg, seq):
    """The record's prediction, or where the record has none, the lesson's extrapolation from 1 and 2 layers."""
    if str(seq) in _recorded.get(plan, {}):
        return _recorded[plan][str(seq)]
    return ref.plan_memory(plan, cfg, 1, seq).peak


plan_rows = []
for card, total in (("T4 15 GiB", profile_for("t4").total_memory), ("A100 40 GB", 40 * 10**9),
                    ("H100 80 GB", profile_for("h100").total_memory)):
    choice = ref.plan_fine_tune(total, L8, 4096, _recorded_peak)
    plan_rows.append([card, choice["plan"] if choice else "nothing fits", gib(choice["peak"], 1) if choice else "—"])
plan_table = markdown_table(["card", "first plan that fits (Llama-3.1-8B, 4,096 tokens)", "predicted peak"], plan_rows)
