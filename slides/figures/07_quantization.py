"""Lesson 07's deck: the 8B model in fp16, Q8_0 and Q4_0 (the usual "8 GB" estimate, recounted), per-tensor against
per-block scales, Q4_0's levels and the share of blocks whose codes would change if made with the fp16 scale, on
blocks the lesson's own kernels quantize, the lesson's error table (its H100 run), a rotation before quantizing (the
idea of SpinQuant, arXiv 2405.16406) measured with the lesson's kernels, the fused int8
matmul and int8_linear on the H200 record (device time under CUDA graphs), the block kernels on the H100 record,
8-bit AdamW states: the bytes (lesson 01's state_bytes), the dynamic code, the states measured on the course-tiny
GPT, convergence (the CPU record) and the H100 step."""
from __future__ import annotations

import functools
import inspect
import json
import math

import matplotlib.patches as patches
import torch

import memfit
from autograder.checks.quantization import BLOCK_CASES, CHECKS, CONVERGENCE, MATMUL_CASES  # noqa: F401 (the deck)
from memfit.from_lessons.activations import activation_bytes
from memfit.from_lessons.fused_linear_ce import chunk_plan
from memfit.from_lessons.model_states import count_params, state_bytes
from memfit.gpt import COURSE_CONFIGS, LLAMA_3_1_8B as L8, unique_parameters
from memfit.hardware import KERNEL_CONFIGS, KNOWN_GPUS, KiB, profile_for  # noqa: F401 (the deck)
from memfit.training import Trainer, measure_step
from slides.figures import (STYLE, COLORS, arrow, canvas, figure, gib, lesson, limit, log_record,  # noqa: F401
                            RESULTS, markdown_table, measured_on, pct, record, source)

LESSON = "07_quantization"
GB = 1e9
ref = lesson(LESSON)

# ------------------------------------------------------------------------------------------ the 8B arithmetic

# bits per weight of each format, from the lesson's Quantized on a tensor of whole blocks
_w = torch.randn(ref.QK * 8, generator=torch.Generator().manual_seed(0))
bits = {"fp32": 32.0, "fp16": 16.0, "Q8_0": ref.quantize_q8_0(_w).bits_per_weight,
        "Q4_0": ref.quantize_q4_0(_w).bits_per_weight}
n = count_params(L8)
b = {k: n * v / 8 for k, v in bits.items()}
t4 = profile_for("t4").total_memory

# ------------------------------------------------------------------- per tensor against per block; Q4_0's levels


def _outlier_demo() -> dict:
    """Four blocks of 32 small weights (std 0.01) with one outlier of 0.5 (50x) in the second block, in Q8_0 with
    the lesson's kernels. Per tensor, d is the largest block scale (the absmax of all 128 values, / 127)."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(4 * ref.QK, generator=gen) * 0.01
    x[ref.QK + 9] = 0.5
    qt = ref.quantize_q8_0(x)
    x_hat = ref.dequantize_q8_0(qt)
    d_block = qt.scales.float()
    d_tensor = d_block.max()
    return {"x": x, "d_block": d_block, "d_tensor": float(d_tensor), "block_of": torch.arange(x.numel()) // ref.QK,
            "zero_block": int(((x_hat == 0) & (x != 0)).sum()),
            "zero_tensor": int(((x.abs() / d_tensor).round() == 0).sum()), "n": x.numel()}


def _q4_demo() -> dict:
    """One block whose largest magnitude is negative, with a positive value of nearly the same size: Q4_0's
    clamp, by the lesson's kernels."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(ref.QK, generator=gen) * 0.12
    x[5], x[20] = -0.5, 0.48
    x_hat = ref.dequantize_q4_0(ref.quantize_q4_0(x))
    q8 = ref.dequantize_q8_0(ref.quantize_q8_0(x))
    return {"x": x, "x_hat": x_hat, "d": float(ref.quantize_q4_0(x).scales[0]), "err": (x_hat - x).abs(),
            "q8_err": (q8 - x).abs(), "d8": float(ref.quantize_q8_0(x).scales[0])}


@functools.cache
def _fp16_first_share() -> float:
    """The share of 1,024 Gaussian blocks whose Q8_0 codes (the lesson's kernel: llama.cpp's, from the fp32 scale)
    differ from codes made with the fp16-rounded scale (roundf(x · (1 / fp16(d))))."""
    x = torch.randn(1024, ref.QK, generator=torch.Generator().manual_seed(5)) * 0.02
    d16 = (x.abs().amax(dim=1, keepdim=True) / 127).half().float()
    v = x * (1 / d16)
    a = v.abs()
    fp16_first = torch.sign(v) * torch.where(a - a.floor() >= 0.5, a.floor() + 1, a.floor())
    return float((fp16_first != ref.quantize_q8_0(x).data.float()).any(dim=1).float().mean())


o = _outlier_demo()
blocks_cfg = KERNEL_CONFIGS["quant_blocks"]
q4 = _q4_demo()

# ---------------------------------------------------------------------------------- the lesson's H100 log

# the error table the lesson printed on an H100
log = log_record("lesson07_log")
e = {(kind, method): tuple(err) for kind, by in log["errors"].items() for method, err in by.items()}
log["source"] = f"{source(log)} (the notebook's own output)"
err_table = markdown_table(["", "Gaussian W", "Gaussian y", "heavy-tailed W", "heavy-tailed y"],
                           [[m, pct(e["Gaussian", m][0], 2), pct(e["Gaussian", m][1], 2),
                             pct(e["heavy-tailed", m][0], 2), pct(e["heavy-tailed", m][1], 2)]
                            for m in ("int8 per tensor", "Q8_0", "Q4_0")])

# ------------------------------------------------------------------------------------ rotation (SpinQuant)


def _rotation() -> dict:
    """The lesson's heavy-tailed weights (Student's t, 3 dof, x 0.01, one outlier of 0.5 per 2000), rotated by a
    random orthogonal R: y = x Wᵀ = (x R)(W R)ᵀ. Layer-output error of Q8_0 and Q4_0 (the lesson's kernels)."""
    rows, cols = 32, 256
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    w = torch.distributions.StudentT(3.0).sample((rows, cols)) * 0.01
    idx = torch.randint(0, rows * cols, (rows * cols // 2000,), generator=gen)
    w.view(-1)[idx] = 0.5 * torch.sign(torch.randn(idx.numel(), generator=gen))
    x = torch.randn(64, cols, generator=gen)
    r, _ = torch.linalg.qr(torch.randn(cols, cols, generator=gen))
    y = x @ w.T
    out = {"shape": f"{rows} × {cols}", "outliers": idx.numel()}
    for name, wt, xt in (("plain", w, x), ("rotated", w @ r, x @ r)):
        for fmt in ("q8_0", "q4_0"):
            w_hat = getattr(ref, f"dequantize_{fmt}")(getattr(ref, f"quantize_{fmt}")(wt))
            out[name, fmt] = float((xt @ w_hat.T - y).norm() / y.norm())
        out[name, "w"] = wt
        out[name, "kurtosis"] = float(((wt - wt.mean()) ** 4).mean() / wt.var() ** 2)
    return out


r = _rotation()
rot_table = markdown_table(
    ["layer-output error", "W as it is", "W R (rotated)"],
    [["Q8_0", pct(r["plain", "q8_0"], 2), pct(r["rotated", "q8_0"], 2)],
     ["Q4_0", pct(r["plain", "q4_0"], 1), pct(r["rotated", "q4_0"], 1)],
     ["kurtosis of the weights", f"{r['plain', 'kurtosis']:.0f}", f"{r['rotated', 'kurtosis']:.1f}"]])

# ------------------------------------------------------------------------- the fused matmul: bytes, tiles
w_bytes = (ref.CODE_BYTES["q8_0"] + 2) / ref.QK
up_hat = L8.ffn_hidden * L8.d_model * 2
mm_cfg = KERNEL_CONFIGS["int8_matmul"]
small_threshold = ref.INT8_MATMUL_CLASSES[0][0]  # the most rows of x the decoding tiles serve
mm_classes = [("M ≤ " + str(most)) if most else f"M > {ref.INT8_MATMUL_CLASSES[-2][0]}"
              for most, _ in ref.INT8_MATMUL_CLASSES]


def tiles(t):
    split = f", K / {t['SPLIT_K']}" if t["SPLIT_K"] > 1 else ""
    return f"{t['BLOCK_M']} × {t['BLOCK_N']} × {t['BLOCK_K']}{split}"


tile_rows = [[label] + [tiles(mm_cfg[key][variant]) for _, variant in ref.INT8_MATMUL_CLASSES]
             for key, label in (("cpu", "cpu (interpreter)"), ("t4", "T4, V100"), ("gpu", "other GPUs"),
                                ("h100", "H100"))]
h_large = mm_cfg["h100"]["m_large"]

# --------------------------------------------------------------------------------------- the H100 records
q = record("quantization", file="h100")  # the block kernels and the optimizers (the H100 record)
qm = record("quantization", file="matmul")  # the matmul alone: device time under CUDA graphs, and int8_linear
FP16, DEQ, FUSED, LINEAR = "fp16 matmul (cuBLAS)", "dequantize, then matmul", "fused int8 matmul", "int8_linear"
shapes = list(dict.fromkeys(r_["shape"] for r_ in qm["quantization"]["matmul"]))
matmul = {shape: {} for shape in shapes}  # shape -> M -> contender -> row
for r_ in qm["quantization"]["matmul"]:
    matmul[r_["shape"]].setdefault(r_["m"], {})[r_["contender"]] = r_


def _ratios(lo: int, hi: int, who: str = FUSED) -> list[float]:
    """`who`'s time / cuBLAS's over every shape for lo <= M <= hi."""
    return [by[who]["us"] / by[FP16]["us"] for rows in matmul.values() for m, by in rows.items() if lo <= m <= hi]


def _span(lo: int, hi: int, who: str = FUSED) -> str:
    return "–".join(dict.fromkeys(f"{f(_ratios(lo, hi, who)):.2f}×" for f in (min, max)))


decode_lo, decode_hi = (f"{f(_ratios(1, 16)):.2f}×" for f in (min, max))
prefill_lo, prefill_hi = (f"{f(_ratios(256, 1 << 20)):.1f}×" for f in (min, max))
m64_lo, m64_hi = (f"{f(_ratios(64, 64)):.1f}×" for f in (min, max))
linear_spans = {m: _span(m, m, LINEAR) for m in (64, 256, 1024, 4096)}
host_lo, host_hi = (f(by[LINEAR]["host_us"] for rows in matmul.values() for m, by in rows.items() if m <= 64)
                    for f in (min, max))
up_name = next(sh for sh in shapes if "up" in sh)
up = matmul[up_name]
mm_table = markdown_table(["M", "cuBLAS fp16 µs", "deq. + mm µs", "fused µs", "int8_linear µs", "fused / fp16",
                           "int8_linear / fp16", "deq. + mm MiB", "fused MiB", "int8_linear MiB"],
                          [[f"{m:,}", f"{by[FP16]['us']:.1f}", f"{by[DEQ]['us']:.1f}", f"{by[FUSED]['us']:.1f}",
                            f"{by[LINEAR]['us']:.1f}", f"{by[FUSED]['us'] / by[FP16]['us']:.2f}×",
                            f"{by[LINEAR]['us'] / by[FP16]['us']:.2f}×", f"{by[DEQ]['peak_mib']:,.1f}",
                            f"{by[FUSED]['peak_mib']:,.2f}", f"{by[LINEAR]['peak_mib']:,.1f}"]
                           for m, by in sorted(up.items())])
# the H100 sweep of the two ways to load the scales, read by key from its table's JSON companion
_tiles_rec = record("int8_matmul_tiles")
t = {"ratios": _tiles_rec["int8_matmul_tiles"]["ratios"], "source": source(_tiles_rec)}
one = up[1]

# the block kernels record
fmts = q["quantization"]["formats"]
copy = next(r_ for r_ in fmts if r_["op"].startswith("copy"))
formats_table = markdown_table(
    ["format", "op", "µs", "TB/s", "of a copy", "relative error"],
    [[r_["format"], r_["op"], f"{r_['us']:.1f}", f"{r_['gbs'] / 1000:.2f}", pct(r_["gbs"] / copy["gbs"], 0),
      pct(r_["relative_error"], 2)] for r_ in fmts])

# ---------------------------------------------------------------------------------- 8-bit optimizer states
n8 = n
base, eight = state_bytes(n8, "amp", "adamw"), state_bytes(n8, "amp", "adamw8bit")
sc, uc = ref.dynamic_code(True), ref.dynamic_code(False)


def _code_demo() -> dict:
    """One block of v = g² (heavy-tailed gradients): how many values a linear 8-bit grid and the dynamic code
    store as 0, with the lesson's quantize_blockwise (which takes any sorted code)."""
    gen = torch.Generator().manual_seed(11)
    g = torch.randn(ref.STATE_BLOCK, generator=gen) / torch.rand(ref.STATE_BLOCK, generator=gen).add_(0.02) * 1e-3
    v = g * g
    out = {"n": v.numel(), "decades": float(torch.log10(v.max() / v.min()))}
    for name, code in (("linear", torch.linspace(0, 1, 255)), ("dynamic", ref.dynamic_code(signed=False))):
        codes, absmax = ref.quantize_blockwise(v, code)
        back = ref.dequantize_blockwise(codes, absmax, code)
        out[name] = int(((back == 0) & (v > 0)).sum())
    return out


def _states_tiny() -> dict:
    """Optimizer-state bytes per parameter after a step of the course trainer in amp, AdamW and the lesson's
    AdamW8bit, at this machine's training_step size (the lesson's demo)."""
    size = memfit.hardware.size("training_step")
    cfg = COURSE_CONFIGS[size["config"]]
    out = {"config": cfg.name}
    for name, make in (("AdamW", "adamw"), ("AdamW8bit", lambda p: ref.AdamW8bit(p, lr=3e-4, weight_decay=0.1))):
        trainer = Trainer(cfg, precision="amp", optimizer=make)
        step = measure_step(trainer, size["batch"], size["seq"])
        out["n"] = sum(p.numel() for p in unique_parameters(trainer.model))
        out[name] = step.states["optimizer"] / out["n"]
    return out


cd = _code_demo()
params = inspect.signature(ref.AdamW8bit.__init__).parameters
chunk = params["chunk"].default
chunk_fact = f"2^{{{int(math.log2(chunk))}}}"
st = _states_tiny()

# the grader's convergence check run on the reference, on a CPU, read by key from its table's JSON companion
_conv = record("adamw8bit_convergence")
c = {**_conv["adamw8bit_convergence"], "source": source(_conv)}

# the H100 optimizer record
opt = q["quantization"]["optimizers"]
opt_table = markdown_table(
    ["optimizer", "state B/param", "W + G + states B/param", "step peak MiB", "train step ms", "opt. step ms"],
    [[r_["optimizer"], f"{r_['state_bytes_per_param']:.3f}", f"{r_['model_state_bytes_per_param']:.2f}",
      f"{r_['step_peak_mib']:,.0f}", f"{r_['train_step_ms']:.1f}", f"{r_['optimizer_step_ms']:.2f}"] for r_ in opt])
_opt = {r_["optimizer"]: r_ for r_ in opt}
adamw, adamw_fused = _opt["torch.optim.AdamW (foreach)"], _opt["torch.optim.AdamW (fused)"]
opt8, fused8 = _opt["AdamW8bit (PyTorch, exercise 5)"], _opt["FusedAdamW8bit (Triton)"]
h_size = memfit.hardware.size("training_step", profile_for("h100"))


def _train_step_ratios() -> list[float]:
    """FusedAdamW8bit's training step over fused AdamW's in every H100 record of this benchmark on the newest record's
    date: the step is bound by the host, whose speed drifts from run to run, so the deck shows their range."""
    ratios = []
    for path in sorted(RESULTS.glob(f"*h100*{q['date']}-quantization*.json")):
        rows = {r_["optimizer"]: r_ for r_ in json.loads(path.read_text()).get("quantization", {}).get("optimizers", [])}
        if "FusedAdamW8bit (Triton)" in rows and "torch.optim.AdamW (fused)" in rows:
            ratios.append(rows["FusedAdamW8bit (Triton)"]["train_step_ms"] / rows["torch.optim.AdamW (fused)"]["train_step_ms"])
    return ratios or [fused8["train_step_ms"] / adamw_fused["train_step_ms"]]


train_ratios = _train_step_ratios()

# --- grading
what = {"q8_0": "llama.cpp's bytes: every scale and code exact (halves, near halves, tiny values); round trip "
                "bound; zeros, ragged n; fp32/fp16/bf16; no PyTorch math",
        "q4_0": "llama.cpp's bytes: signed scale, the tie rule, every code exact; nibble layout decoded by the "
                "check",
        "int8_matmul": "vs x·Ŵᵀ, tolerance by the course's rule; ragged M, N, K; every tile class; split K; halves of K "
                       "that cancel; bad input raises",
        "int8_matmul_memory": "no tensor half the size of Ŵ during the call",
        "blockwise": "nearest level of the code; fp32 absmax per 256; zero blocks",
        "adamw8bit_step": "step 1 = AdamW; 8 steps vs float64 run; ≤ 1 B/param scratch",
        "adamw8bit_convergence": "course-tiny, 20-step means within the margin of AdamW"}
grading_table = markdown_table(["check", "pts", "what it tests"],
                               [[f"`{c_.name}`", f"{c_.points:g}", what[c_.name]] for c_ in CHECKS])

# --- the course in one table (lesson 07's outlook, Llama-3.1-8B at 8 x 4,096 tokens)
batch, seq = 8, 4096
states = sum(base.values())
acts = L8.n_layers * activation_bytes(L8, batch, seq, "amp", "none")
acts_full = L8.n_layers * activation_bytes(L8, batch, seq, "amp", "full")
c_tok, c_cols = chunk_plan(batch * seq, L8.d_model, L8.vocab_size, 2)
tile_bytes = c_tok * c_cols * 2 + (c_tok * L8.d_model * 4 if c_cols < L8.vocab_size else 0)
course_table = markdown_table(["", "technique", "what it saves (8B, 8 × 4,096 tokens)", "its price"], [
    ["01", "mixed precision + AdamW", f"baseline: {states / GB:.0f} GB of states", "—"],
    ["02", "full recomputation", f"activations {acts / GB:.0f} → {acts_full / GB:.1f} GB", "a 2nd forward"],
    ["03", "ZeRO-3, 8 GPUs", f"states {states / GB:.0f} → {states / 8 / GB:.0f} GB per GPU", "all-gathers"],
    ["05", "FlashAttention", f"N × N scores: {batch * L8.n_heads * seq * seq * 2 / GB:.0f} GB per layer",
     "none: faster"],
    ["06", "fused linear CE", f"logits {batch * seq * L8.vocab_size * 4 / GB:.0f} GB → {tile_bytes / GB:.2f} GB",
     "a recomputed matmul"],
    ["07", "8-bit AdamW states", f"states {states / GB:.0f} → {sum(eight.values()) / GB:.0f} GB",
     "rounding of m, v"],
    ["07", "Q8_0 / Q4_0 weights", f"fp16 {b['fp16'] / GB:.1f} → {b['Q8_0'] / GB:.1f} / {b['Q4_0'] / GB:.1f} GB",
     f"{pct(e['heavy-tailed', 'Q8_0'][1])} / {pct(e['heavy-tailed', 'Q4_0'][1], 0)} output error"]])

# --- the summary table
sb = (1 + 4 / ref.STATE_BLOCK) * 8
summary_table = markdown_table(["", "bits / value", "scale", "error bound", "for"], [
    ["int8 per tensor", "8", "fp32 per tensor", "d/2, d set by the outlier", "(what not to do)"],
    ["Q8_0", f"{bits['Q8_0']:g}", f"fp16 per {ref.QK}", "d/2 + 127·\\|d − d̂\\|",
     f"weights: 8B in {b['Q8_0'] / GB:.1f} GB"],
    ["Q4_0", f"{bits['Q4_0']:g}", f"signed fp16 per {ref.QK}", "\\|d\\| + 8·\\|d − d̂\\|",
     f"weights: 8B in {b['Q4_0'] / GB:.1f} GB"],
    ["8-bit dynamic", f"{sb:g}", f"fp32 per {ref.STATE_BLOCK}", "half a gap between levels",
     f"m, v: {sum(base.values()) / n8:.0f} → {sum(eight.values()) / n8:.0f} B/param"]])


# ================================================================================================= figures

def styled(fn):
    """Draw the whole figure under the decks' style, so titles and labels added after figure() are large too."""
    @functools.wraps(fn)
    def wrapper():
        import matplotlib.pyplot as plt
        with plt.rc_context(STYLE):
            return fn()
    return wrapper


@styled
def fig_formats():
    """Llama-3.1-8B's weights in each format against a T4's memory."""
    names = ["fp32", "fp16", "Q8_0", "Q4_0"]
    vals = [b[k] / 2**30 for k in names]
    fig, ax = figure(figsize=(6.4, 4.6))
    bars = ax.barh(names, vals, color=[COLORS["neutral"], COLORS["params"], COLORS["ours"], COLORS["optimizer"]])
    ax.invert_yaxis()
    limit(ax, t4 / 2**30, f"T4: {t4 / 2**30:.0f} GiB", (t4 / 2**30 + 0.4, 3.45), lw=2, fontsize=15, va="center")
    for bar, v, k in zip(bars, vals, names):
        ax.text(v + 0.4, bar.get_y() + bar.get_height() / 2, f"{b[k] / GB:.1f} GB", va="center", fontsize=14)
    ax.set(xlim=(0, max(vals) * 1.25), xlabel="GiB of weights", title=f"Llama-3.1-8B: {n / 1e9:.2f}B parameters")
    ax.grid(axis="y", visible=False)
    fig.tight_layout()
    return fig


@styled
def fig_scales():
    """|x| of four blocks with an outlier: values under d/2 round to 0, per tensor and per block."""
    x, qk = o["x"].abs(), o["n"] // len(o["d_block"])
    low = float(x[x > 0].min())
    fig, ax = figure(figsize=(6.6, 4.8))
    block_colors = [COLORS["params"], COLORS["grads"], COLORS["optimizer"], COLORS["ours"]]
    ax.scatter(range(o["n"]), x, s=18, c=[block_colors[int(i)] for i in o["block_of"]], zorder=3)
    ax.axhline(o["d_tensor"] / 2, color=COLORS["activations"], lw=2.5, ls="--")
    ax.text(o["n"] - 1, low / 8, f"- - per tensor d/2: {o['zero_tensor']} of {o['n']} → 0",
            ha="right", color=COLORS["activations"], fontsize=14)
    for i, d in enumerate(o["d_block"].tolist()):
        ax.plot([i * qk, (i + 1) * qk - 1], [d / 2, d / 2], color="black", lw=2.5)
    ax.text(o["n"] - 1, low / 3, f"— per block d/2: {o['zero_block']} → 0", fontsize=14, ha="right")
    ax.set(yscale="log", ylim=(low / 20, 1.5), xlabel=f"value index (blocks of {qk})", ylabel="|x|",
           title="one outlier (0.5) among weights of std 0.01")
    fig.tight_layout()
    return fig


@styled
def fig_layouts():
    """The bytes of one block as GGUF stores it: Q8_0 (an fp16 scale, then 32 int8 codes) and Q4_0 (the scale, then
    16 bytes of two nibbles), byte 0 on the left."""
    fig, ax = canvas(figsize=(13.5, 3.0))
    n8, n4 = ref.CODE_BYTES["q8_0"], ref.CODE_BYTES["q4_0"]

    def rect(x, y, w, color):
        ax.add_patch(patches.Rectangle((x, y), w - 0.08, 0.9, facecolor=color, edgecolor="none"))

    def label(x, y, text, size, **kw):
        ax.text(x, y, text, ha="center", va="center", fontsize=size, color="white", **kw)

    for y, name, text in ((2.45, "Q8_0", f"fp16 d + {n8} int8 = {n8 + 2} bytes"),
                          (0.95, "Q4_0", f"fp16 d + {n4} bytes = {n4 + 2} bytes")):
        rect(0, y - 0.45, 2, COLORS["activations"])
        label(0.96, y, "d", 14, weight="bold")
        for j in range(n8 if name == "Q8_0" else n4):
            if name == "Q8_0":
                rect(2 + j, 2, 1, COLORS["ours"])
                if j % 4 == 0:
                    label(2 + j + 0.46, 2.45, str(j), 13)
            else:
                rect(2 + 2 * j, 0.5, 1, COLORS["optimizer"])
                rect(2 + 2 * j + 1, 0.5, 1, COLORS["params"])
                if j < 2:
                    label(2 + 2 * j + 0.46, 0.95, str(j), 12)
                    label(2 + 2 * j + 1.46, 0.95, str(j + n4), 12)
        ax.text(-0.6, y, name, ha="right", va="center", fontsize=18, weight="bold")
        ax.text(n8 + 2.4, y, text, va="center", fontsize=17)  # Q4_0's 2·n4 bytes of nibbles end where Q8_0's end
    ax.text(0, 0.05, f"GGUF, block after block; Q4_0 byte j: value j in the low nibble (green), value j + {n4} in the "
            "high (blue)", fontsize=16, va="center")
    ax.set(xlim=(-4.2, n8 + 16), ylim=(-0.2, 3.0))
    return fig


@styled
def fig_q4_levels():
    """One block: Q4_0's 16 levels (q − 8)·d, the values and where they land; the clamp on the short side."""
    x, x_hat, d = q4["x"], q4["x_hat"], q4["d"]
    fig, ax = figure(figsize=(6.6, 4.6))
    levels = (torch.arange(16) - 8) * d
    for lv in levels.tolist():
        ax.axvline(lv, color=COLORS["neutral"], lw=1, alpha=0.6)
    for y, i in zip(torch.linspace(0, 1, x.numel()).tolist(), torch.argsort(x).tolist()):
        clamped = float((x_hat[i] - x[i]).abs()) > abs(d) / 2 + 1e-6
        color = COLORS["activations"] if clamped else COLORS["params"]
        ax.plot([float(x[i]), float(x_hat[i])], [y, y], color=color, lw=2)
        ax.plot(float(x[i]), y, "o", color=color, ms=6)
        ax.plot(float(x_hat[i]), y, "|", color="black", ms=10, mew=2)
    ax.annotate("code 0: −8d = m\n(exact)", (float(levels[0]), 0.02), xytext=(float(levels[0]) + 0.06, 0.2),
                fontsize=13, arrowprops=dict(arrowstyle="->"))
    ax.annotate("+7d: the top is\nclamped, error ≤ |d|", (float(levels[-1]), 0.98),
                xytext=(float(levels[-1]) - 0.3, 0.3), fontsize=13, color=COLORS["activations"],
                arrowprops=dict(arrowstyle="->", color=COLORS["activations"]))
    ax.set(yticks=[], xlabel=f"value  (16 levels, d = m / −8 = {d:.4f})",
           title="Q4_0 on one block: value ● → level |")
    ax.grid(False)
    fig.tight_layout()
    return fig


@styled
def fig_errors():
    """The lesson's chart: layer-output error after a round trip, from its H100 run."""
    methods = ["int8 per tensor", "Q8_0", "Q4_0"]
    fig, ax = figure(figsize=(6.6, 4.6))
    for i, (kind, color) in enumerate((("Gaussian", COLORS["params"]), ("heavy-tailed", COLORS["activations"]))):
        vals = [100 * e[kind, m][1] for m in methods]
        bars = ax.bar([j + 0.4 * i for j in range(3)], vals, width=0.4, color=color, label=kind)
        for bar, v in zip(bars, vals):
            ax.text(bar.get_x() + bar.get_width() / 2, v * 1.12, f"{v:.2g}%", ha="center", fontsize=12)
    ax.set_xticks([j + 0.2 for j in range(3)], methods)
    ax.set(yscale="log", ylim=(0.2, 150), ylabel="layer output error, %")
    ax.legend(loc="upper right", frameon=False)
    ax.set_title("‖x Ŵᵀ − x Wᵀ‖ / ‖x Wᵀ‖")
    fig.tight_layout()
    return fig


@styled
def fig_tile():
    """One program of the fused kernel: x tile, int8 codes, the compact scale tile broadcast, tl.dot."""
    tile = mm_cfg["h100"]["m_large"]
    bk, bn, bm = tile["BLOCK_K"], tile["BLOCK_N"], tile["BLOCK_M"]
    fig, ax = canvas(figsize=(11, 3.9))

    def box(x, y, w, h, color, title, sub):
        ax.add_patch(patches.FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03", facecolor=color, alpha=0.9,
                                            edgecolor="none"))
        ax.text(x + w / 2, y + h * 0.66, title, ha="center", va="center", fontsize=15, color="white",
                weight="bold")
        ax.text(x + w / 2, y + h * 0.28, sub, ha="center", va="center", fontsize=12, color="white")

    box(0, 2.2, 2.3, 0.9, COLORS["params"], "codes q", f"int8 [{bn}, {bk}]")
    box(0, 0.7, 2.3, 0.9, COLORS["activations"], "scales d", f"fp16 [{bn}, {bk // ref.QK}]")
    box(3.6, 1.45, 2.6, 0.9, COLORS["ours"], "q · d", "→ x's dtype")
    box(3.6, -0.35, 2.6, 0.9, COLORS["grads"], "xᵀ tile", f"[{bk}, {bm}]")
    box(7.3, 0.7, 1.7, 0.9, COLORS["neutral"], "tl.dot", "+= fp32 acc")
    box(9.6, 0.7, 1.7, 0.9, COLORS["optimizer"], "yᵀ tile", f"[{bn}, {bm}]")
    arrow(ax, (2.35, 2.6), (3.55, 2.05))
    arrow(ax, (2.35, 1.15), (3.55, 1.75))
    ax.text(2.45, 0.95, f"reshape: ×{ref.QK}", fontsize=12)
    arrow(ax, (6.25, 1.9), (7.25, 1.3))
    ax.text(6.45, 1.95, "Ŵ tile", fontsize=12)
    arrow(ax, (6.25, 0.1), (7.25, 0.95))
    arrow(ax, (9.05, 1.15), (9.55, 1.15))
    ax.text(0, 3.4, f"loop along K, BLOCK_K = {bk} at a time: Ŵ exists only as this tile, in registers",
            fontsize=14)
    ax.set(xlim=(-0.2, 11.5), ylim=(-0.5, 3.7))
    return fig


@styled
def fig_matmul():
    """The matmul record: fused int8 and dequantize-then-matmul, device time / cuBLAS fp16's, against M."""
    fig, ax = figure(figsize=(6.8, 4.7))
    for shape, color in zip(shapes, [COLORS["params"], COLORS["grads"], COLORS["optimizer"]]):
        rows = matmul[shape]
        ms = sorted(rows)
        ax.plot(ms, [rows[m][FUSED]["us"] / rows[m][FP16]["us"] for m in ms], "o-", color=color, lw=2.5,
                label=f"fused, {shape}")
        ax.plot(ms, [rows[m][DEQ]["us"] / rows[m][FP16]["us"] for m in ms], "s--", color=color, lw=1.5,
                alpha=0.7, ms=5)
        ax.plot(ms, [rows[m][LINEAR]["us"] / rows[m][FP16]["us"] for m in ms], "^:", color=color, lw=2, ms=6)
    ax.axhline(1, color="black", lw=1)
    ax.text(200, 0.55, "cuBLAS fp16 = 1", fontsize=13)
    ax.plot([], [], "s--", color=COLORS["neutral"], label="dequantize, then matmul")
    ax.plot([], [], "^:", color=COLORS["neutral"], label="int8_linear (slices + cuBLAS from 65 rows)")
    ax.set_xscale("log", base=2)
    ms = sorted(matmul[shapes[0]])
    ax.set_xticks(ms, [f"{m:,}" for m in ms])
    ax.minorticks_off()
    ax.set(xlabel="M: tokens in x", ylabel="device time / cuBLAS fp16")
    ax.legend(fontsize=11, loc="upper left", frameon=False)
    ax.set_ylim(0, 1.25 * max(_ratios(1, 1 << 20, DEQ) + _ratios(1, 1 << 20)))
    fig.tight_layout()
    return fig


@styled
def fig_state_bytes():
    """Llama-3.1-8B's model states under mixed precision: AdamW against 8-bit AdamW (lesson 01's state_bytes)."""
    fig, ax = figure(figsize=(6.6, 3.6))
    left = [0.0, 0.0]
    for key, color, label in (("params", COLORS["params"], "fp32 weights"), ("grads", COLORS["grads"], "fp32 grads"),
                              ("optimizer", COLORS["optimizer"], "m and v")):
        vals = [base[key] / GB, eight[key] / GB]
        ax.barh(["AdamW", "AdamW8bit"], vals, left=left, color=color, label=label)
        for i, v in enumerate(vals):
            ax.text(left[i] + v / 2, i, f"{v:.0f}", ha="center", va="center", color="white", fontsize=14)
        left = [a + v for a, v in zip(left, vals)]
    for i, tot in enumerate(left):
        ax.text(tot + 2, i, f"{tot:.0f} GB", va="center", fontsize=14)
    ax.invert_yaxis()
    ax.set(xlim=(0, max(left) * 1.2), xlabel="GB, Llama-3.1-8B, mixed precision")
    ax.legend(ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.3), frameon=False, fontsize=12)
    ax.grid(axis="y", visible=False)
    fig.tight_layout()
    return fig


@styled
def fig_dynamic_code():
    """The dynamic code's 255 levels (log scale) against a linear 8-bit grid."""
    fig, ax = figure(figsize=(6.6, 4.4))
    pos = sc[sc > 0]
    ax.plot(uc[1:], range(1, uc.numel()), ".", ms=5, color=COLORS["optimizer"], label="dynamic, unsigned (v)")
    ax.plot(pos, range(sc.numel() - pos.numel(), sc.numel()), ".", ms=5, color=COLORS["params"],
            label="dynamic, signed (m), > 0")
    ax.plot(torch.linspace(0, 1, 255)[1:], range(1, 255), ".", ms=4, color=COLORS["neutral"], label="linear 8-bit grid")
    ax.set(xscale="log", xlabel="level (value / block absmax)", ylabel="code")
    ax.legend(loc="upper left", frameon=False, fontsize=12)
    fig.tight_layout()
    return fig


@styled
def fig_convergence():
    """The grader's convergence check on the reference (CPU record): 20-step mean losses."""
    mids = [(a + b_) / 2 for a, b_, *_ in c["rows"]]
    fig, ax = figure(figsize=(6.6, 4.5))
    ax.plot(mids, [r_[2] for r_ in c["rows"]], "o-", color=COLORS["neutral"], lw=3, ms=8, label="AdamW (fp32 m, v)")
    ax.plot(mids, [r_[3] for r_ in c["rows"]], "x--", color=COLORS["ours"], lw=2, ms=9, mew=2, label="AdamW8bit")
    ax.axhline(c["floor"], color="black", ls=":", lw=1.5)
    ax.text(mids[-1], c["floor"] + 0.12, "the chain's entropy", ha="right", fontsize=13)
    ax.set(xlabel="step (mean of each 20)", ylabel="loss, nats", ylim=(0, 8))
    ax.legend(frameon=False)
    ax.set_title("course-tiny on the Markov corpus")
    fig.tight_layout()
    return fig


@styled
def fig_rotation():
    """The weights' histogram before and after the rotation (the same matrix as the table)."""
    fig, ax = figure(figsize=(6.0, 4.4))
    bins = torch.linspace(-0.55, 0.55, 45)
    for key, color, label in (("plain", COLORS["activations"], "W"), ("rotated", COLORS["params"], "W R")):
        ax.hist(r[key, "w"].flatten().numpy(), bins=bins.numpy(), color=color, alpha=0.6, label=label, log=True)
    ax.set(xlabel="weight value", ylabel="count (log)")
    ax.legend(frameon=False)
    ax.set_title("the outliers spread over the row")
    fig.tight_layout()
    return fig
