"""Lesson 01's deck: exact parameter counts with the lesson's count_params, the bytes of every training recipe with
its state_bytes, an itemised 8B tally checked, a training step of the course GPT measured op by op on this
machine, and what the recorded H100 run of the notebook saw between a prediction and nvidia-smi."""
from __future__ import annotations

import functools
import textwrap

import matplotlib.patches as patches
import torch

import memfit  # noqa: F401 (the deck)
from autograder.checks import CheckFailed
from autograder.checks import model_states as checks
from autograder.checks.model_states import measured_state_bytes  # the graded check's own measurement
from memfit.gpt import (COURSE_CONFIGS, GPT, LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B, LLAMA_3_2_1B,
                        n_params)
from memfit.training import Trainer, random_batch, timeline
from slides.figures import (COLORS, canvas, figure, gb, gib, lesson, log_record, markdown_table,  # noqa: F401
                            measured_on, mib, record, source)

LESSON = "01_model_states"

# An itemised tally of the kind often quoted for an "8B" model under mixed precision with Adam: the bytes per
# parameter of each item, an overhead on top, and the usual total of 16 bytes per parameter (the ZeRO paper's
# count, Rajbhandari et al., 2020, arXiv 1910.02054). The deck recomputes their sums and sets them against the
# lesson's exact count and recipes.
TALLY_N = 8e9
TALLY_ITEMS = [("fp16 weights", "params", 2), ("fp32 master copy", "master", 4), ("Adam m and v (fp32)", "states", 8),
               ("fp32 gradients", "grads", 4)]
TALLY_OVERHEAD = "10–20%"
TALLY_QUOTED_BYTES_PER_PARAM = 16  # the usual "128 GB" for 8B parameters

RECIPE_LABELS = {"fp32": "fp32", "amp": "amp (autocast)", "mixed": "mixed (Megatron)",
                 "mixed_fp32_grads": "mixed + fp32 grads", "bf16": "bf16"}
PHASE_COLORS = {"forward": COLORS["params"], "backward": COLORS["grads"], "optimizer": COLORS["optimizer"],
                "idle": COLORS["neutral"]}
MODELS = [COURSE_CONFIGS["tiny"], COURSE_CONFIGS["small"], COURSE_CONFIGS["medium"], LLAMA_3_2_1B, LLAMA_3_1_8B,
          LLAMA_3_1_70B, LLAMA_3_1_405B]
ref = lesson(LESSON)
h100, h200 = record("first_kernel", file="h100"), record("first_kernel", file="h200")


def _b(n: float, digits: int = 2) -> str:
    """A parameter count in billions."""
    return f"{n / 1e9:.{digits}f}B"


# ------------------------------------------------------------------------------------------ counting

def _split(cfg) -> dict[str, int]:
    """The parameters of a config by piece; the pieces must add up to the lesson's count_params."""
    h, kv, L = cfg.d_model, cfg.n_kv_heads * cfg.head_dim, cfg.n_layers
    parts = {"embeddings + head": cfg.vocab_size * h * (1 if cfg.tie_embeddings else 2),
             "attention": L * (h * (h + 2 * kv) + h * h), "MLP": L * 3 * h * cfg.ffn_hidden, "norms": (2 * L + 1) * h}
    assert sum(parts.values()) == ref.count_params(cfg), cfg.name
    return parts


@functools.cache
def _meta_count(cfg) -> int:
    """The real model built on PyTorch's meta device (shapes only): the count the grader holds answers to."""
    with torch.device("meta"):
        return n_params(GPT(cfg))


# ------------------------------------------------------------------------------------------ bytes

def _per_param(precision: str, optimizer: str = "adamw") -> dict[str, float]:
    """Bytes per parameter of a recipe for Llama-3.1-8B, from the lesson's state_bytes; the optimizer's bytes split
    into the fp32 master copy and the states (AdamW holds two states, SGD one: their difference is one state)."""
    got = {k: v / n8b for k, v in ref.state_bytes(n8b, precision, optimizer).items()}
    adamw = ref.state_bytes(n8b, precision, "adamw")["optimizer"]
    one_state = (adamw - ref.state_bytes(n8b, precision, "sgd")["optimizer"]) / n8b
    master = adamw / n8b - 2 * one_state
    return {"params": got["params"], "grads": got["grads"], "master": master,
            "states": got["optimizer"] - master, "total": sum(got.values())}


def _total(n: int, precision: str, optimizer: str = "adamw") -> int:
    return sum(ref.state_bytes(n, precision, optimizer).values())


# ---------------------------------------------------------------- what the deck quotes ({{ name }} in its Markdown)

cfg = LLAMA_3_1_8B
n8b = ref.count_params(cfg)
h, kv, L, f = cfg.d_model, cfg.n_kv_heads * cfg.head_dim, cfg.n_layers, cfg.ffn_hidden
parts = _split(cfg)
rule = 12 * L * h * h

# the itemised tally
tally_bpp = sum(b for _, _, b in TALLY_ITEMS)
tally_table = markdown_table(["the tally's item", "bytes / param", "× 8B"],
                             [[name, str(b), f"{TALLY_N * b / 1e9:.0f} GB"] for name, _, b in TALLY_ITEMS]
                             + [["temporary buffers, communication", "", f"+ {TALLY_OVERHEAD}"]])

# counting
piece_rows = [
    ["token embedding", "`embed`", "V × h", f"{cfg.vocab_size * h:,}"],
    ["RMSNorm before attention", "`norm1.weight`", "h", f"{h:,}"],
    ["q, k, v projections", "`wqkv`", "h × (h + 2·kv)", f"{h * (h + 2 * kv):,}"],
    ["attention output", "`wo`", "h × h", f"{h * h:,}"],
    ["RMSNorm before the MLP", "`norm2.weight`", "h", f"{h:,}"],
    ["SwiGLU gate + up, down", "`w13`, `w2`", "h × 2f, f × h", f"{3 * h * f:,}"],
    ["final RMSNorm", "`norm.weight`", "h", f"{h:,}"],
    ["output head (untied)", "`head`", "h × V", f"{cfg.vocab_size * h:,}"],
]
rows = []
for model in MODELS:
    count = ref.count_params(model)
    r = 12 * model.n_layers * model.d_model ** 2
    rows.append([model.name, f"{count:,}", f"{r:,}", f"{(r - count) / count:+.0%}",
                 f"{_split(model)['embeddings + head'] / count:.0%}"])
rule_table = markdown_table(["model", "count_params", "12·L·h²", "rule off by", "embeddings"], rows)
big = MODELS[-1]
big_kv = big.n_kv_heads * big.head_dim
big_layer = big.d_model * (big.d_model + 2 * big_kv) + big.d_model ** 2 + 3 * big.d_model * big.ffn_hidden
big_layer_h2 = f"{big_layer / big.d_model ** 2:g}"

# bytes per recipe
per_8bit = ref.state_bytes(n8b, "amp", "adamw8bit")["optimizer"] / n8b
try:
    ref.state_bytes(1000, "fp8", "adamw")
    bad_name = "(no error raised)"
except ValueError as e:
    bad_name = str(e)

amp = _per_param("amp")
mixed = _per_param("mixed")
mixed32 = _per_param("mixed_fp32_grads")
fits = {o: [p for p in ref.STATE_PRECISIONS if _total(n8b, p, o) <= h100["memory_gib"] * 2**30]
        for o in ref.STATE_OPTIMIZERS}
fits_h100 = "; ".join(f"`{o}` with " + ", ".join(f"`{p}`" for p in ps) for o, ps in fits.items() if ps)
table = [[f"`{p}`"] + [f"{_total(n8b, p, o) / n8b:.2f} B · {gib(_total(n8b, p, o))}" for o in ref.STATE_OPTIMIZERS]
         for p in ref.STATE_PRECISIONS]


# measuring

def _timelines():
    """The lesson's demo, here and now: the course GPT at memfit.size("training_step"), amp + AdamW, the memory
    after every op of its first and its second step."""
    sizes = memfit.size("training_step")
    cfg = COURSE_CONFIGS[sizes["config"]]
    trainer = Trainer(cfg, precision="amp", optimizer="adamw")
    idx, targets = random_batch(cfg, sizes["batch"], sizes["seq"], trainer.device)
    first = timeline(trainer, idx, targets)
    second = timeline(trainer, idx, targets)
    return {"cfg": cfg, "sizes": sizes, "first": first, "second": second, "n": ref.count_params(cfg)}


def _optimizer_start(line) -> int:
    """Index of the last op before the optimizer phase: weights, gradients and (from the second step) m and v."""
    return line.phases.index("optimizer") - 1


tl = _timelines()
first, second, n_tiny = tl["first"], tl["second"], tl["n"]
opt_peak = max(b for b, phase in zip(second.allocated, second.phases) if phase == "optimizer")
if first.peak_phase == second.peak_phase == "backward":
    tl_peak_comment = ("both in backward at this size: here activations, not states, set the peak, and the "
                       "second step's is higher by the m and v it carries")
else:
    tl_peak_comment = (f"the first in {first.peak_phase}, the second in {second.peak_phase}: the peak moves "
                       "once m and v sit in the floor")

# What the trainer holds for each recipe PyTorch runs: weights and optimizer states after a step, gradients after a
# backward pass (what the graded check compares with), against the lesson's state_bytes.
mrows = []
for precision in ("fp32", "amp", "bf16"):
    for optimizer in ("adamw", "sgd"):
        meas = measured_state_bytes(COURSE_CONFIGS["tiny"], precision, optimizer)
        pred = ref.state_bytes(ref.count_params(COURSE_CONFIGS["tiny"]), precision, optimizer)
        mrows.append([f"`{precision}`", f"`{optimizer}`"] + [f"{meas[k]:,}" for k in ("params", "grads", "optimizer")]
                     + ["**exact**" if pred == meas else "differs"])
measured_table = markdown_table(["recipe", "optimizer", "params (B)", "grads (B)", "optimizer (B)", "`state_bytes`"],
                                mrows)

# the recorded H100 notebook run: lesson 01's GPU cells in the newest recorded run of the notebooks
log = log_record("lesson01_log")
log_source = f"{log['device']}, torch {log['torch']}, {log['date']}: {log['path']} (lesson 01's GPU cells)"
log_match = ("measured: the same" if all(log["predicted"][k] == log["measured"][k] for k in ("params", "optimizer"))
             else "measured " + " + ".join(log["measured"][k] for k in ("params", "optimizer")))

# grading
plan = {c.name: c for c in checks.CHECKS}
nowrap = lambda name: f'<span style="white-space: nowrap">{name}</span>'  # noqa: E731
forgot_head = lambda c: ref.count_params(c.scaled(tie_embeddings=True))  # noqa: E731  (a learner's bug)
try:
    checks.check_count_params(forgot_head)
    hint_message = "(the check passed)"
except CheckFailed as e:
    hint_message = "\n".join(textwrap.wrap(str(e), 100))
grading = record("grading")
verdicts = grading["grading"]["per_lesson"][LESSON]
grading_recorded = (f"all {len(verdicts)} checks passed" if set(verdicts.values()) == {"passed"}
                    else ", ".join(f"`{k}` {v}" for k, v in verdicts.items()))


# ------------------------------------------------------------------------------------------ figures

def fig_per_layer():
    """One layer in units of h²: the rule of thumb's attention and MLP against Llama-3.1-8B's (GQA, SwiGLU)."""
    ours = {"attention": (h * (h + 2 * kv) + h * h) / h**2, "MLP": 3 * h * f / h**2}
    rule = {"attention": 4, "MLP": 8}  # the rule's 4h² (Q, K, V, O) and 8h² (two matrices of width 4h)
    fig, ax = figure(figsize=(6.4, 4.6))
    for i, parts in enumerate((rule, ours)):
        bottom = 0
        for name, color in (("attention", COLORS["params"]), ("MLP", COLORS["optimizer"])):
            ax.bar(i, parts[name], bottom=bottom, color=color, width=0.6, label=name if i == 0 else None)
            ax.text(i, bottom + parts[name] / 2, f"{name}\n{parts[name]:g} h²", ha="center", va="center",
                    color="white", fontsize=15, fontweight="bold")
            bottom += parts[name]
        ax.text(i, bottom + 0.25, f"{bottom:g} h²", ha="center", va="bottom", fontsize=16)
    ax.set_xticks([0, 1], ["rule of thumb\nMHA, 2 matrices, 4h", f"{cfg.name}\nGQA, SwiGLU, {f / h:g}h"])
    ax.set(ylabel="weights per layer (units of h²)", ylim=(0, 15))
    ax.grid(axis="x")
    return fig


def fig_breakdown_8b():
    """Llama-3.1-8B's parameters by piece, from count_params's pieces, against the 12·L·h² rule."""
    colors = {"embeddings + head": COLORS["activations"], "attention": COLORS["params"], "MLP": COLORS["optimizer"],
              "norms": COLORS["neutral"]}
    fig, ax = figure(figsize=(11, 3.9))
    ax.barh(1, rule / 1e9, color=COLORS["peer"], height=0.55)
    ax.text(rule / 1e9 / 2, 1, "12·L·h²: attention 4h² + MLP 8h² per layer", ha="center", va="center",
            color="white", fontsize=14, fontweight="bold")
    ax.text(rule / 1e9 + 0.08, 1, _b(rule), va="center", fontsize=15)
    left = 0
    for name, n in parts.items():
        label = name if n / 1e9 > 0.5 else f"{name} ({n / 1e6:.2f}M)"
        ax.barh(0, n / 1e9, left=left, color=colors[name], height=0.55, label=label)
        if n / 1e9 > 0.5:
            ax.text(left + n / 2e9, 0, _b(n), ha="center", va="center", color="white", fontsize=15,
                    fontweight="bold")
        left += n / 1e9
    ax.text(left + 0.08, 0, f"{_b(left * 1e9)}", va="center", fontsize=15)
    ax.set_yticks([0, 1], ["count_params", "rule of thumb"])
    ax.set(xlabel="billions of parameters", xlim=(0, left * 1.13), ylim=(1.45, -0.45))
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, frameon=False, fontsize=14)
    ax.grid(axis="y")
    return fig


def fig_bytes_per_param():
    """Each recipe (AdamW) as a strip of bytes per parameter, from the lesson's state_bytes, with the itemised list."""
    rows = [("the itemised list", {kind: float(b) for _, kind, b in TALLY_ITEMS})]
    rows += [(RECIPE_LABELS[p], _per_param(p)) for p in ref.STATE_PRECISIONS]
    kinds = [("params", "weights", COLORS["params"], None), ("grads", "gradients", COLORS["grads"], None),
             ("master", "fp32 master", COLORS["optimizer"], "//"), ("states", "Adam m, v", COLORS["optimizer"], None)]
    fig, ax = canvas(figsize=(11.5, 4.9))
    for y, (label, per) in enumerate(rows):
        x = 0
        for kind, _, color, hatch in kinds:
            for _ in range(int(round(per.get(kind, 0)))):
                ax.add_patch(patches.Rectangle((x, -y - 0.38), 0.9, 0.76, facecolor=color, edgecolor="white",
                                               hatch=hatch, lw=0.5))
                x += 1
        ax.text(-0.4, -y, label, ha="right", va="center", fontsize=15)
        ax.text(x + 0.2, -y, f"{x} B", ha="left", va="center", fontsize=15, fontweight="bold")
    for kind, name, color, hatch in kinds:
        ax.add_patch(patches.Rectangle((0, 0), 0, 0, facecolor=color, hatch=hatch, edgecolor="white", label=name))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, frameon=False, fontsize=14)
    ax.set(xlim=(-7.2, 23), ylim=(-len(rows) + 0.5, 0.6))
    ax.set_title("bytes per parameter, AdamW (one square = one byte)", fontsize=15)
    return fig


def fig_tally_8b():
    """Llama-3.1-8B's states under each recipe, in GB, against the memory of one H100 and one H200 (recorded)."""
    bars = [("itemised\nlist", {kind: sum(b for _, k, b in TALLY_ITEMS if k in members) * n8b
                                for kind, members in (("params", {"params"}), ("grads", {"grads"}),
                                                      ("optimizer", {"master", "states"}))})]
    bars += [(label, ref.state_bytes(n8b, p, o)) for label, p, o in
             (("amp", "amp", "adamw"), ("mixed", "mixed", "adamw"), ("mixed+fp32\ngrads", "mixed_fp32_grads", "adamw"),
              ("bf16", "bf16", "adamw"), ("amp, 8-bit\nAdam", "amp", "adamw8bit"))]
    fig, ax = figure(figsize=(11, 4.9))
    for i, (label, parts_) in enumerate(bars):
        bottom = 0
        for kind, color, name in (("params", COLORS["params"], "weights"), ("grads", COLORS["grads"], "gradients"),
                                  ("optimizer", COLORS["optimizer"], "optimizer (master + states)")):
            ax.bar(i, parts_[kind] / 1e9, bottom=bottom, color=color, width=0.62, label=name if i == 0 else None)
            bottom += parts_[kind] / 1e9
    for rec, style in ((h100, "--"), (h200, ":")):
        cap = rec["memory_gib"] * 2**30 / 1e9
        ax.axhline(cap, color=COLORS["activations"], ls=style, lw=2.2)
        ax.text(1.01, cap, f"one {rec['device'].replace('NVIDIA ', '').split()[0]}\n{rec['memory_gib']:.1f} GiB",
                transform=ax.get_yaxis_transform(), ha="left", va="center", color=COLORS["activations"], fontsize=14)
    ax.set_xticks(range(len(bars)), [f"{label}\n{sum(p.values()) / 1e9:.1f} GB" for label, p in bars])
    ax.set(ylabel="GB (10⁹ bytes)", ylim=(0, 175), xlim=(-0.5, len(bars) - 0.5))
    ax.grid(axis="x")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False, fontsize=14)
    return fig


def fig_timeline():
    """The lesson's demo on this machine: bytes of live tensors after every op of the first and second step, in MiB
    (left) and in bytes per parameter (right), with the level at which the optimizer step begins marked."""
    n = n_tiny
    fig, axes = figure(ncols=2, figsize=(12.5, 4.4), sharey=True)
    notes = {"first step": "weights + grads", "second step": "weights + grads + m + v"}
    for ax, line, title in zip(axes, (first, second), ("first step", "second step")):
        in_mib = [b / 2**20 for b in line.allocated]
        start = 0
        for i in range(1, len(line.phases) + 1):  # one shaded band per run of ops in the same phase
            if i == len(line.phases) or line.phases[i] != line.phases[start]:
                ax.axvspan(start - 0.5, i - 0.5, color=PHASE_COLORS[line.phases[start]], alpha=0.18, lw=0)
                start = i
        ax.plot(in_mib, color="black", lw=1.3)
        peak = line.allocated.index(line.peak)
        ax.plot([peak], [in_mib[peak]], "o", color=COLORS["activations"], ms=8)
        ax.set_title(f"{title}: peak {in_mib[peak]:.1f} MiB ({line.peak_phase})", fontsize=15)
        ax.set(xlabel="PyTorch op", xlim=(-1, len(in_mib)))
        ax.grid(axis="x")
        ax.text(len(in_mib) * 0.02, in_mib[0] - 0.8, f"start: {line.allocated[0] / n:.0f} B/param", fontsize=13,
                va="top")
        at = _optimizer_start(line)
        ax.plot([at], [in_mib[at]], "s", color=COLORS["optimizer"], ms=8)
        ax.annotate(f"{line.allocated[at] / n:.0f} B/param:\n{notes[title]}", (at, in_mib[at]),
                    xytext=(at - len(in_mib) * 0.05, in_mib[at] + (9 if title == "first step" else 7)), ha="right",
                    fontsize=13, color=COLORS["optimizer"], arrowprops=dict(arrowstyle="->", color=COLORS["optimizer"]))
    axes[0].set_ylabel("MiB of live tensors")
    top = max(second.peak, first.peak) / 2**20 * 1.12
    axes[0].set_ylim(0, top)
    per_param = axes[1].secondary_yaxis("right", functions=(lambda m: m * 2**20 / n, lambda b: b * n / 2**20))
    per_param.set_ylabel("bytes per parameter", fontsize=15)
    per_param.set_yticks([b for b in range(0, int(top * 2**20 / n) + 1, 4)])
    per_param.tick_params(labelsize=13)
    for phase in ("forward", "backward", "optimizer"):
        axes[1].add_patch(patches.Rectangle((0, 0), 0, 0, color=PHASE_COLORS[phase], alpha=0.35, label=phase))
    axes[1].legend(loc="upper left", frameon=False, fontsize=13)
    fig.tight_layout()
    return fig
