"""The overview deck: the memory of one training step of Llama-3.1-8B, by part, from the lessons' predictors,
the map of which lesson cuts which part (each cut computed with that lesson's formulas), the lessons and their
points from the grader, and three recorded headline measurements."""
from __future__ import annotations


import matplotlib.pyplot as plt

from autograder.checks import checks_for
from course.lessons import lessons
from memfit.from_lessons.activations import activation_bytes, predict_peak
from memfit.from_lessons.fine_tune import lora_state_bytes
from memfit.from_lessons.model_states import count_params, state_bytes
from memfit.from_lessons.quantization import QK
from memfit.from_lessons.zero import zero_bytes_per_rank
from memfit.gpt import LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B
from memfit.plots import stacked_peak_chart
from slides.figures import COLORS, figure, gb, gib, limit, markdown_table, record, source  # noqa: F401

SEQ, BATCH, GPUS = 8192, 1, 8
LORA_R = 16
PARTS = ("params", "grads", "optimizer", "activations", "temporaries")
PART_COLORS = {**{p: COLORS[p] for p in ("params", "grads", "optimizer", "activations")},
               "temporaries": COLORS["neutral"]}
cfg, n = LLAMA_3_1_8B, count_params(LLAMA_3_1_8B)


def _cuts() -> list[tuple[str, str, str, int, int]]:
    """(lesson, technique, what it cuts, bytes before, bytes after) for Llama-3.1-8B at 1 x 8192 tokens."""
    T = BATCH * SEQ
    mixed = sum(state_bytes(n, "mixed", "adamw").values())
    pure_bf16 = sum(state_bytes(n, "bf16", "adamw").values())
    eight_bit = sum(state_bytes(n, "mixed", "adamw8bit").values())
    acts = cfg.n_layers * activation_bytes(cfg, BATCH, SEQ, "amp", "none")
    acts_full = cfg.n_layers * activation_bytes(cfg, BATCH, SEQ, "amp", "full")
    scores = cfg.n_layers * BATCH * cfg.n_heads * SEQ * SEQ * 2   # bf16 attention probabilities kept per layer
    lse = cfg.n_layers * BATCH * cfg.n_heads * SEQ * 4             # what FlashAttention keeps instead: fp32 log-sum-exp
    logits = T * cfg.vocab_size * 4                                 # fp32 logits of the loss
    chunk = 1024 * cfg.vocab_size * 4                               # one 1,024-token chunk of them
    q8_0 = n * (QK + 2) // QK                                       # int8 codes + one fp16 scale per 32 weights
    lora_states = lora_state_bytes(cfg, LORA_R)                     # bf16 frozen base, fp32 adapters and AdamW
    lora = sum(v for k, v in lora_states.items() if k != "trainable")
    return [
        ("01", "pure bf16, no fp32 master", "model states", mixed, pure_bf16),
        ("02", "full recomputation", "activations", acts, acts_full),
        ("03", f"ZeRO-3 over {GPUS} GPUs", "model states per GPU", mixed, zero_bytes_per_rank(3, n, GPUS)["total"]),
        ("05", "FlashAttention", "attention scores (naive: s² per head)", scores, lse),
        ("06", "chunked fused linear CE", "fp32 logits", logits, chunk),
        ("07", "AdamW8bit", "model states (Adam: 8 → 2 B/param)", mixed, eight_bit),
        ("07", "Q8_0 weights (inference)", "bf16 weights", 2 * n, q8_0),
        ("08", f"LoRA r={LORA_R} on every block matrix", "model states (only adapters are trained)", mixed, lora),
    ]


def _size(n_bytes: int) -> str:
    return gb(n_bytes) if n_bytes >= 1e9 else f"{n_bytes / 1e6:,.0f} MB"


def _points() -> list[tuple[str, str, float, int]]:
    """(lesson, topic, points, checks) from each lesson's autograder checks."""
    rows = []
    for lesson in lessons():
        number, topic = lesson.split("_", 1)
        checks = checks_for(lesson)
        rows.append((number, topic.replace("_", " "), sum(c.points for c in checks), len(checks)))
    return rows


# ---------------------------------------------------------------- what the deck quotes ({{ name }} in its Markdown)

recipes = [("fp32", "fp32 weights, grads, Adam"), ("amp", "autocast: fp32 weights, bf16 compute"),
           ("mixed", "bf16 weights + grads, fp32 master + Adam"), ("bf16", "pure bf16")]
recipe_rows = []
for precision, what in recipes:
    total = sum(state_bytes(n, precision, "adamw").values())
    recipe_rows.append([f"`{precision}`", what, f"{total / n:.0f}", gb(total)])
recipes_table = markdown_table(["recipe", "what is kept", "B/param", "Llama-3.1-8B"], recipe_rows)
peak = predict_peak(cfg, BATCH, SEQ, "amp", "adamw", "none")
cuts = _cuts()
cut_rows = [[lesson, technique, cut, _size(before), _size(after), f"{before / after:,.0f}×"]
            for lesson, technique, cut, before, after in cuts]
points = _points()
lessons_table = markdown_table(["#", "lesson", "points", "checks"], [[a, b, f"{c:g}", d] for a, b, c, d in points])
first = record("first_kernel", file="h100")
ours = next(r for r in first["first_kernel"]["rows"] if r["impl"].startswith("reference"))
acts = record("activations")
flce = record("fused_linear_ce")
gemma = {r["contender"]: r for r in flce["fused_linear_ce"]["rows"] if r["head"] == "Gemma-2-2B"}


# ------------------------------------------------------------------------------------------------- figures

def fig_step_picture():
    """Llama-3.1-8B, one training step at 1 x 8192 tokens (amp, AdamW): the predicted peak by part,
    against the memory of a T4 and of an H100."""
    fig, ax = figure(figsize=(10, 3.4))
    left = 0.0
    for part in PARTS:
        width = peak[part] / 2**30
        ax.barh([0], [width], left=left, color=PART_COLORS[part], edgecolor="white")
        if width > 6:
            ax.text(left + width / 2, 0, f"{'temp.' if part == 'temporaries' else part}\n{width:.0f} GiB",
                    ha="center", va="center", color="white", fontsize=13)
        left += width
    for name, at in (("T4: 15 GiB", 15), ("H100: 80 GiB", 80)):
        limit(ax, at, name, (at + 1, 0.45), fontsize=13)
    ax.set(yticks=[], ylim=(-0.5, 0.7),
           xlabel=f"GiB at the step's peak ({peak['moment']}), predicted by lesson 02's predict_peak")
    ax.grid(axis="y", visible=False)
    return fig


def fig_context():
    """Lesson 02's own chart: the predicted peak of 8B, 70B and 405B against sequence length."""
    with plt.rc_context({"font.size": 13}):
        return stacked_peak_chart(predict_peak, [LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B],
                                  seqs=[1024, 4096, 16384, 65536])


def fig_cuts():
    """Each lesson's cut for Llama-3.1-8B, before and after, on a log scale."""
    fig, ax = figure(figsize=(9.5, 4.6))
    ys = range(len(cuts))
    ax.barh([y + 0.2 for y in ys], [r[3] / 1e9 for r in cuts], 0.4, color=COLORS["neutral"], label="before")
    ax.barh([y - 0.2 for y in ys], [r[4] / 1e9 for r in cuts], 0.4, color=COLORS["ours"], label="after")
    ax.set_yticks(list(ys), [f"{lesson} {technique}" for lesson, technique, *_ in cuts])
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel(f"GB, Llama-3.1-8B, {BATCH} x {SEQ:,} tokens")
    ax.legend(loc="lower right")
    return fig
