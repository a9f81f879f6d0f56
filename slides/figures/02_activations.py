"""Lesson 02's deck: Korthikanti et al.'s activation numbers recomputed, what autograd keeps in a block of the course
GPT (measured here on the tiny model), the per-layer formula against Korthikanti's, the walk of a training step and
its predicted peak, the recorded H200 run (predictor against the CUDA allocator, recomputation's time), the
micro-batch and accumulation arithmetic, and the 8B/70B/405B context-length chart drawn by the lesson's predictor."""
from __future__ import annotations

import functools

import matplotlib.patches as patches
import matplotlib.pyplot as plt

import memfit
from autograder.checks.activations import CHECKS
from memfit.from_lessons.model_states import count_params, state_bytes
from memfit.gpt import COURSE_CONFIGS, LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B, LLAMA_3_2_1B  # noqa: F401
from memfit.hardware import profile_for
from memfit.plots import stacked_peak_chart
from memfit.training import Trainer, random_batch, saved_tensors, timeline
from slides.figures import (COLORS, STYLE, arrow, canvas, dtype_name, figure, gb, gib, lesson, limit,  # noqa: F401
                            markdown_table, measured_on, mib, record, source, stacked)

LESSON = "02_activations"
BENCH = "activations"
MODES = ("none", "selective", "full")
MODE_COLORS = {"none": COLORS["activations"], "selective": COLORS["grads"], "full": COLORS["params"]}
# DeepSeek-V3's first long-context stage (arXiv 2412.19437, section 4.3): 1920 sequences of "32K" tokens (read as
# 32,768 and as 32,000).
DS_SEQS, DS_SEQ, DS_SEQ_DECIMAL = 1920, 32_768, 32_000
DS_MICRO = 16  # a worked example's micro-batch of 16 sequences
CHART_SEQS = [1024, 2048, 4096, 8192, 16384, 32768]  # the context-length chart's lengths
DP = 8  # data-parallel ranks in the exercise's example (and the visible check)
ref = lesson(LESSON)


def _tiny() -> dict:
    """The notebook's demo on this machine: block 0's saved tensors, and the timeline of one steady-state step
    (memory after every op) with the lesson's predicted peak. Shared by the deck's expressions and the figures."""
    sizes = memfit.size("training_step")
    cfg = COURSE_CONFIGS[sizes["config"]]
    trainer = Trainer(cfg, "amp")
    idx, targets = random_batch(cfg, sizes["batch"], sizes["seq"], trainer.device)
    saved = [s for s in saved_tensors(trainer.model, idx, targets, trainer.autocast())
             if s.module.startswith("blocks.0")]
    trainer.step(idx, targets)  # warm-up: the optimizer states exist, as in a steady-state step
    line = timeline(trainer, idx, targets)
    predicted = ref.predict_peak(cfg, sizes["batch"], sizes["seq"], "amp", "adamw", "none")
    return {"cfg": cfg, "batch": sizes["batch"], "seq": sizes["seq"], "saved": saved, "line": line,
            "states": sum(trainer.state_bytes().values()), "predicted": predicted}


def _korthikanti(cfg, batch: int, seq: int) -> int:
    """Korthikanti et al.'s bytes per GPT-3 layer in fp16 with dropout (13bsh + 5bs²a + 21bsh)."""
    return 34 * seq * batch * cfg.d_model + 5 * cfg.n_heads * seq * seq * batch


def _rough_12nd(cfg, batch: int, seq: int) -> int:
    """A rough estimate often quoted: 6·n·d values per layer in 2 bytes (n = tokens, d = hidden)."""
    return 12 * batch * seq * cfg.d_model


@functools.cache
def _crossover(cfg) -> int:
    """The shortest sequence (batch 1, amp, AdamW, no recomputation) whose predicted peak is no longer the
    optimizer step: where activations take over the step's peak. The peak grows with the sequence: bisect."""
    low, high = 1, cfg.max_seq_len
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if ref.predict_peak(cfg, 1, mid, "amp", "adamw", "none")["moment"] != "optimizer step" \
            else (mid, high)
    return high


# ---------------------------------------------------------------- what the deck quotes ({{ name }} in its Markdown)

big = LLAMA_3_1_8B
h, L = big.d_model, big.n_layers

# The paper's counts, recomputed.
n8 = count_params(big)
states8 = sum(state_bytes(n8, "amp", "adamw").values())
s16 = 16_384
s2 = 5 * big.n_heads * s16 * s16

# Measured here: block 0 of the tiny model.
tiny = _tiny()
cfg = tiny["cfg"]
acts = [s for s in tiny["saved"] if s.kind == "activation"]
block = ref.activation_bytes(cfg, tiny["batch"], tiny["seq"], "amp", "none")

# Per layer: the course formula against Korthikanti's, for Llama-3.1-8B (the coefficient of s·b·h).
per = {m: ref.activation_bytes(big, 1, 4096, "amp", m) / (4096 * h) for m in MODES}
coef_none, coef_sel, coef_full = (f"{per[m]:.1f}" for m in MODES)
dtype_table = markdown_table(["precision", "residual, norms", "matmul in/out", "weights, grads"],
                             [[f"`{p}`", *(f"{b} B" for b in ref.dtype_bytes(p))] for p in ref.STEP_PRECISIONS])

# The walk of a step, measured here, and the prediction.
line, pred = tiny["line"], tiny["predicted"]
pred_table = markdown_table(["category", "predicted at the peak"],
                            [[k, mib(pred[k], 2)] for k in ("params", "grads", "optimizer", "activations",
                                                             "temporaries", "peak")])

# The recorded run: predictor against the CUDA allocator, recomputation.
rec = record(BENCH)
body = rec[BENCH]
moments = [r["moment"] for r in body["rows"]]
errors = [r["error"] for r in body["rows"]]
rec_sign = ("every error is negative: the predictor is a little low" if max(errors) < 0 else
            "every error is positive: the predictor is a little high" if min(errors) > 0 else
            "errors of both signs")
opt_rows = [f"course-{r['model']} at {r['seq']} tokens" for r in body["rows"]
            if r["moment"] == "optimizer step" and r["recompute"] == "none"]
rec_opt_none = (f"Without recomputation the peak is already the optimizer step for {', '.join(opt_rows)}:"
                " there recomputation saves nothing" if opt_rows else
                "Without recomputation no configuration peaks at the optimizer step")
timing = {(t["model"], t["recompute"]): t for t in body["timing"]}
tmodels = list(dict.fromkeys(t["model"] for t in body["timing"]))


def slowdown(model: str, mode: str) -> str:
    return f"{timing[(model, mode)]['slowdown']:+.0%}"


def saves(model: str, mode: str) -> str:
    return f"{1 - timing[(model, mode)]['peak'] / timing[(model, 'none')]['peak']:.0%}"


slower = all(timing[(m, "selective")]["ms"] > timing[(m, "full")]["ms"] for m in tmodels)
sel_vs_full = "saves less and was **slower** than full here" if slower else "saves less than full"
ranked = sorted(tmodels, key=lambda m: timing[(m, "full")]["slowdown"])

# Micro-batch and accumulation: Llama-3.2-1B at 8K on an 80 GiB card (memfit's H100 profile), the largest
# micro-batch per recompute mode, and the accumulation steps of DeepSeek-V3's global batch on DP ranks.
mb_rows = []
for mode in MODES:
    best = ref.max_micro_batch(LLAMA_3_2_1B, 8192, profile_for("h100").total_memory, "amp", "adamw", mode)
    steps = ref.accumulation_steps(DS_SEQS * DS_SEQ, best, 8192, data_parallel=DP)
    mb_rows.append([mode, str(best), f"{best * 8192:,}", f"{steps:,}"])
mb_table = markdown_table(["recompute", "largest micro-batch", "tokens per micro-step",
                           f"accumulation steps (DP = {DP})"], mb_rows)

# The context-length chart.
full_opt = [s for s in CHART_SEQS if ref.predict_peak(big, 1, s, "amp", "adamw", "full")["moment"] == "optimizer step"]

# The grader.
pts = {c.name: c.points for c in CHECKS}


# ------------------------------------------------------------------------------------------------ figures

def fig_saved():
    """Block 0 of the demo model: the bytes of each storage autograd saved, grouped by module, kind and dtype
    (a parameter saved by its own op costs nothing and is left out)."""
    groups: dict[str, dict[tuple[str, str], int]] = {}
    for s in tiny["saved"]:
        if s.kind == "parameter":
            continue
        key = (s.kind, dtype_name(s.dtype))
        module = groups.setdefault(s.module.removeprefix("blocks.0."), {})
        module[key] = module.get(key, 0) + s.nbytes
    keys = sorted({k for g in groups.values() for k in g}, key=lambda k: (k[0] != "activation", k[1] != "fp32", k))
    palette = [COLORS["activations"], COLORS["grads"], COLORS["peer"]]
    colors = {}
    for kind, dt in keys:
        colors[(kind, dt)] = COLORS["neutral"] if kind == "weight copy" else palette[len(colors) % len(palette)]
    fig, ax = figure(figsize=(7.2, 5.6))
    stacked(ax, list(groups), [([g.get(key, 0) / 2**10 for g in groups.values()], colors[key], f"{key[0]} ({key[1]})")
                               for key in keys], horizontal=True)
    ax.invert_yaxis()
    ax.set_xlabel("KiB saved for backward")
    ax.legend(loc="upper right", frameon=False)
    ax.set_title(f"{tiny['cfg'].name}, block 0, batch {tiny['batch']} × {tiny['seq']}, amp")
    ax.grid(axis="y", visible=False)
    return fig


# What each recompute mode keeps in one block, in forward order: (label, fp32 under amp?, modes that keep it).
KEPT = [
    ("block input x (residual)", True, MODES),
    ("norm1: 1/rms, normalized x", True, ("none",)),
    ("normalized x cast (wqkv in)", False, ("none",)),
    ("wqkv output q | k | v", False, ("selective",)),
    ("q, k after RoPE; v (GQA: expanded)", False, ("none",)),
    ("attention output, log-sum-exp", False, ("none", "selective")),
    ("wo output", False, ("selective",)),
    ("norm2: x + attn, 1/rms, normalized", True, ("none",)),
    ("normalized x cast (w13 in)", False, ("none",)),
    ("w13 output gate | up", False, ("none", "selective")),
    ("silu(gate), silu(gate) · up", False, ("none",)),
    ("w2 output", False, ("selective",)),
]


def fig_kept():
    """Which tensors of a block each recompute mode keeps between forward and backward (amp: fp32 or 2 bytes)."""
    fig, ax = canvas(figsize=(8.6, 6.6))
    n, W = len(KEPT), 1.4
    for col, mode in enumerate(MODES):
        ax.text(col * W + 0.6, n + 0.15, mode, ha="center", va="bottom", fontsize=17, weight="bold",
                color=MODE_COLORS[mode])
        for row, (label, fp32, modes) in enumerate(KEPT):
            y = n - 1 - row
            kept = mode in modes
            color = COLORS["activations"] if fp32 else COLORS["grads"]
            ax.add_patch(patches.FancyBboxPatch((col * W + 0.1, y + 0.12), 1.0, 0.76, boxstyle="round,pad=0.02",
                                                facecolor=color if kept else "#f4f4f4",
                                                edgecolor=color if kept else "#cccccc", linewidth=1.2))
            if col == 0:
                ax.text(-0.12, y + 0.5, label, ha="right", va="center", fontsize=14)
    recomputed = dict(facecolor="#f4f4f4", edgecolor="#cccccc")
    for x, text_x, text, style in ((-3.9, -3.5, "fp32", dict(color=COLORS["activations"])),
                                   (-2.6, -2.2, "2 bytes under amp", dict(color=COLORS["grads"])),
                                   (0.4, 0.8, "recomputed in backward", recomputed)):
        ax.add_patch(patches.Rectangle((x, -1.05), 0.3, 0.55, **style))
        ax.text(text_x, -0.78, text, va="center", fontsize=14)
    ax.set(xlim=(-4.0, len(MODES) * W + 0.05), ylim=(-1.2, n + 0.8))
    return fig


def fig_per_layer():
    """Bytes one layer of Llama-3.1-8B keeps, batch 1, against the sequence: the rough 12·n·d, Korthikanti's
    34sbh + 5as²b, and the lesson's activation_bytes (amp) in its three recompute modes."""
    seqs = [2**k for k in range(10, 18)]
    fig, ax = figure(figsize=(7.4, 5.4))
    ax.plot(seqs, [_korthikanti(big, 1, s) / 2**30 for s in seqs], "--", color=COLORS["neutral"], lw=2.5,
            label="34sbh + 5as²b (GPT-3, fp16)")
    ax.plot(seqs, [_rough_12nd(big, 1, s) / 2**30 for s in seqs], ":", color=COLORS["peer"], lw=2.5,
            label="rough 12·n·d")
    for mode in MODES:
        ax.plot(seqs, [ref.activation_bytes(big, 1, s, "amp", mode) / 2**30 for s in seqs], "o-",
                color=MODE_COLORS[mode], lw=2.5, label=f"course GPT, {mode}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(seqs, [f"{s // 1024}K" for s in seqs])
    ax.set(xlabel="sequence length s (batch 1)", ylabel="GiB per layer", title=f"{big.name}, one layer")
    ax.legend(loc="upper left", frameon=False, fontsize=12)
    return fig


def fig_walk():
    """The memory of one steady-state training step of the tiny model, after every op, measured here; the
    lesson's predicted peak as a line."""
    fig, ax = figure(figsize=(7.0, 5.0))
    xs = range(len(line.allocated))
    in_mib = [a / 2**20 for a in line.allocated]
    phase_colors = {"forward": COLORS["params"], "backward": COLORS["activations"], "optimizer": COLORS["optimizer"]}
    for phase, color in phase_colors.items():
        ax.fill_between(xs, 0, in_mib, where=[p == phase for p in line.phases], color=color, alpha=0.75,
                        step="post", label=phase, linewidth=0)
    ax.axhline(tiny["states"] / 2**20, color="black", lw=1.2, ls=":")
    ax.text(len(in_mib) * 0.01, tiny["states"] / 2**20, "params + optimizer states", va="bottom", fontsize=13,
            bbox=dict(facecolor="white", alpha=0.85, edgecolor="none", pad=1.5))
    limit(ax, pred["peak"] / 2**20, f"predicted peak: {pred['moment']}", (len(in_mib) * 0.99, pred["peak"] / 2**20),
          vertical=False, color=COLORS["ours"], lw=2, ha="right", va="bottom", fontsize=13)
    ax.set(ylim=(0, pred["peak"] / 2**20 * 1.15), xlim=(0, len(in_mib)), xlabel="op of the step, in order",
           ylabel="MiB of tensors alive")
    ax.legend(loc="upper right", frameon=False, bbox_to_anchor=(1.0, 0.84))
    ax.set_title(f"{cfg.name}, batch {tiny['batch']} × {tiny['seq']}, amp, AdamW")
    return fig


def fig_predictor():
    """The recorded run: the predicted and the measured (CUDA allocator) peak of each configuration."""
    rows = body["rows"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    seqs = list(dict.fromkeys(r["seq"] for r in rows))
    fig, axes = figure(ncols=len(models), figsize=(12.5, 4.6))
    width = 0.26
    for ax, model in zip(axes, models):
        for k, mode in enumerate(MODES):
            sel = [next(r for r in rows if r["model"] == model and r["seq"] == s and r["recompute"] == mode)
                   for s in seqs]
            xs = [i + (k - 1) * width for i in range(len(seqs))]
            ax.bar(xs, [r["measured"] / 2**30 for r in sel], width * 0.95, color=MODE_COLORS[mode],
                   label=f"{mode}: measured")
            ax.scatter(xs, [r["predicted"] / 2**30 for r in sel], marker="_", s=420, color="black", linewidths=2.5,
                       zorder=3, label="predicted" if k == 0 else None)
        ax.set_xticks(range(len(seqs)), [str(s) for s in seqs])
        ax.set(xlabel=f"sequence length (batch {rows[0]['batch']})", title=f"course-{model}")
        ax.grid(axis="x", visible=False)
    axes[0].set_ylabel("peak of a step, GiB")
    axes[0].legend(loc="upper left", frameon=False, fontsize=12)
    fig.tight_layout()
    return fig


def fig_recompute():
    """The recorded run: step time against peak memory, per recompute mode, for the two course models."""
    fig, ax = figure(figsize=(7.4, 5.0))
    for model, marker in zip(tmodels, ["o", "s", "^"]):
        rows = [timing[(model, m)] for m in MODES]
        ax.plot([t["ms"] for t in rows], [t["peak"] / 2**30 for t in rows], color=COLORS["neutral"], lw=1, zorder=1)
        for t in rows:
            ax.scatter(t["ms"], t["peak"] / 2**30, s=160, marker=marker, color=MODE_COLORS[t["recompute"]], zorder=2)
            ax.annotate(f"{t['recompute']}", (t["ms"], t["peak"] / 2**30), textcoords="offset points",
                        xytext=(10, 4), fontsize=13, color=MODE_COLORS[t["recompute"]])
        ax.annotate(f"course-{model}", (rows[0]["ms"], rows[0]["peak"] / 2**30), textcoords="offset points",
                    xytext=(-8, 14), ha="left", fontsize=14, weight="bold")
    first = body["timing"][0]
    ax.set(xlabel=f"step time, ms (batch {first['batch']} × {first['seq']})", ylabel="measured peak, GiB",
           xlim=(0, max(t["ms"] for t in body["timing"]) * 1.25),
           ylim=(0, max(t["peak"] for t in body["timing"]) / 2**30 * 1.2), title=rec["device"])
    return fig


def fig_global_batch():
    """Global batch = micro-batch × sequence × accumulation steps × data-parallel ranks: a diagram."""
    fig, ax = canvas(figsize=(12, 4.6))
    ranks = ["rank 0", "rank 1", "⋮", "rank D−1"]
    steps = ["step 1", "step 2", "…", "step k"]
    for r, rank in enumerate(ranks):
        y = len(ranks) - 1 - r
        ax.text(-0.2, y + 0.35, rank, ha="right", va="center", fontsize=15)
        for c, step in enumerate(steps):
            if rank == "⋮" or step == "…":
                ax.text(c * 1.6 + 0.7, y + 0.35, "⋮" if rank == "⋮" else "…", ha="center", va="center", fontsize=18)
                continue
            ax.add_patch(patches.FancyBboxPatch((c * 1.6, y + 0.05), 1.4, 0.6, boxstyle="round,pad=0.02",
                                                facecolor=COLORS["params"], alpha=0.85, edgecolor="none"))
            ax.text(c * 1.6 + 0.7, y + 0.35, "b × s tokens", ha="center", va="center", fontsize=11.5, color="white")
    for c, step in enumerate(steps):
        ax.text(c * 1.6 + 0.7, len(ranks) - 0.1, step, ha="center", va="bottom", fontsize=14)
    ax.text(len(steps) * 0.8 - 0.1, len(ranks) + 0.35, "micro-steps: gradients accumulate (+=), no update",
            ha="center", va="bottom", fontsize=14, color=COLORS["neutral"])
    right = len(steps) * 1.6
    arrow(ax, (right - 0.05, 1.9), (right + 0.7, 1.9), lw=2.5, color=COLORS["neutral"])
    ax.add_patch(patches.FancyBboxPatch((right + 0.8, 1.15), 3.6, 1.5, boxstyle="round,pad=0.05",
                                        facecolor=COLORS["optimizer"], edgecolor="none", alpha=0.9))
    ax.text(right + 2.6, 1.9, "sum the gradients\nof k × D micro-batches,\nthen one update",
            ha="center", va="center", fontsize=14, color="white")
    ax.text(right + 2.6, 0.45, "memory holds one\nmicro-batch per GPU", ha="center", va="center",
            fontsize=14, color=COLORS["activations"], weight="bold")
    ax.set(xlim=(-1.5, right + 4.6), ylim=(-0.2, len(ranks) + 0.8))
    return fig


def fig_context_chart():
    """The notebook's own chart (memfit.plots.stacked_peak_chart) with the lesson's predict_peak: Llama-3.1
    8B, 70B, 405B, one sequence per step, amp + AdamW, with and without full recomputation."""
    with plt.rc_context({**STYLE, "axes.grid": False}):
        fig = stacked_peak_chart(ref.predict_peak, [LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B], seqs=CHART_SEQS)
    fig.set_size_inches(15, 5.0)
    for ax in fig.axes:
        ax.set_xlabel("sequence length; hatched: recompute=full", fontsize=14)
        ax.tick_params(labelsize=13)
        ax.title.set_fontsize(17)
    fig.axes[0].set_ylabel("predicted peak, GiB", fontsize=14)
    fig.axes[0].legend(loc="upper left", fontsize=12, frameon=False)
    fig.tight_layout()
    return fig
