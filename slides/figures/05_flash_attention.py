"""Lesson 05's deck: Korthikanti et al.'s 5·b·s²·a term reproduced for Llama-3.1-8B, what naive attention keeps
(measured here on tiny sizes), the online softmax run by the lesson's own online_softmax_stats, the causal tiling of
the lesson's forward kernel, the backward's three kernels, the grading plan read from the checks, and the recorded
H100 run (TFLOP/s against SDPA's flash and cuDNN backends, memory against naive attention) and H200 tile sweep."""
from __future__ import annotations

import math
from collections import Counter

import matplotlib.patches as patches
import torch

import memfit
from autograder.checks import flash_attention as checks
from memfit.from_lessons.activations import activation_bytes
from memfit.gpt import LLAMA_3_1_8B
from memfit.hardware import KERNEL_CONFIGS, KNOWN_GPUS, KiB, config, profile_for
from memfit.meter import measure_peak
from slides.figures import (COLORS, arrow, dtype_name, figure, gib, kib, lesson, markdown_table,  # noqa: F401
                            measured_on, mib, record, source)

LESSON = "05_flash_attention"
TILING_N = 100  # the tiling figure's sequence length: no multiple of the interpreter's tiles
MEMORY_RUN = dict(B=1, H=16, d=64)  # benchmarks/flash_attention.py's memory rows: bf16, causal, these shapes
IMPLS = ("reference", "SDPA flash", "SDPA cuDNN")
IMPL_COLORS = {"reference": COLORS["ours"], "SDPA flash": COLORS["peer"], "SDPA cuDNN": COLORS["neutral"]}
IMPL_LABELS = {"reference": "the lesson's kernels", "SDPA flash": "SDPA flash", "SDPA cuDNN": "SDPA cuDNN"}
KERNELS = ("flash_forward", "flash_dkdv", "flash_dq")
ref = lesson(LESSON)
cfg = LLAMA_3_1_8B

# Korthikanti et al.'s per-layer attention term 5·b·s²·a (fp16 scores, softmax, dropout mask; arXiv 2205.05198) for
# Llama-3.1-8B at a 16K context, against lesson 02's activation_bytes: the whole course-GPT block, whose attention
# keeps no s² tensor.
_s = 16 * 1024
s2 = {"b": 1, "s": _s, "five": 5 * _s * _s * cfg.n_heads, "layers": cfg.n_layers,
      "block": activation_bytes(cfg, 1, _s, "amp"),
      "p_8k": 8192 ** 2 * cfg.n_heads * 2}  # the lesson's opening: P alone at N = 8,192, 32 heads, bf16


# ------------------------------------------------------------------------ measured here, on tiny sizes

def _measured() -> dict:
    """On this machine (the CPU sizes of memfit.size("attention_memory")): what autograd saves for naive attention and
    for the lesson's flash_attention, naive attention's forward + backward peak per N, the flash peak at the smallest
    N, and the error of the online softmax and of the Triton forward."""
    sizes = memfit.size("attention_memory")
    h, d, seqs = sizes["heads"], sizes["head_dim"], sizes["seqs"]
    gen = torch.Generator().manual_seed(5)

    def leaves(n):
        return [torch.randn(1, h, n, d, generator=gen).requires_grad_(True) for _ in range(3)]

    def saved_by(attention, n):
        q, k, v = leaves(n)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((tuple(t.shape), t.dtype)) or t,
                                                      lambda t: t):
            out = attention(q, k, v, causal=True)
        return saved, out, (q, k, v)

    n0 = seqs[0]
    naive_saved, naive_out, qkv = saved_by(ref.naive_attention, n0)
    flash_out = ref.flash_attention(*qkv, causal=True)
    flash_err = (flash_out - naive_out).abs().max().item()
    flash_saved = saved_by(ref.flash_attention, n0)[0]

    def peak(attention, n):  # fresh leaves, no warm-up: the gradients count, as in the lesson's memory check
        q, k, v = leaves(n)
        do = torch.randn(1, h, n, d, generator=gen)
        return measure_peak(lambda: attention(q, k, v, causal=True).backward(do), warmup=False)[1].peak_bytes

    naive_peak = {n: peak(ref.naive_attention, n) for n in seqs}
    flash_peak = peak(ref.flash_attention, n0)

    x = torch.randn(3, 1000, generator=gen) * 30 + 500  # the lesson's demo (its comment: float64 overflows; see deck)
    m, l = ref.online_softmax_stats(x.split(128, dim=1))
    softmax_err = (torch.exp(x - m[:, None]) / l[:, None] - torch.softmax(x, dim=1)).abs().max().item()
    lse_err = (m + l.log() - torch.logsumexp(x, dim=1)).abs().max().item()
    return {"heads": h, "head_dim": d, "seqs": seqs, "n0": n0, "naive_saved": naive_saved, "flash_saved": flash_saved,
            "naive_peak": naive_peak, "flash_peak": flash_peak, "flash_err": flash_err, "softmax_err": softmax_err,
            "lse_err": lse_err, "overflow32": bool(torch.isinf(torch.exp(x)).any()),
            "overflow64": bool(torch.isinf(torch.exp(x.double())).any()), "demo_max": x.max().item(),
            "dtype": qkv[0].dtype}


def _online_row() -> dict:
    """One seeded row of 64 scores with an upward drift (so the maximum moves), in four blocks of 16, through the
    lesson's online_softmax_stats on the first j blocks: (m, l, the factor e^(m_prev - m) that rescaled l)."""
    gen = torch.Generator().manual_seed(3)
    width, n_blocks = 16, 4
    x = torch.randn(1, width * n_blocks, generator=gen) * 1.5 + torch.linspace(0, 4, width * n_blocks)
    blocks = list(x.split(width, dim=1))
    stats, prev = [], None
    for j in range(n_blocks):
        m, l = ref.online_softmax_stats(iter(blocks[: j + 1]))
        m, l = m.item(), l.item()
        stats.append((m, l, None if prev is None else math.exp(prev - m)))
        prev = m
    return {"x": x[0].tolist(), "width": width, "stats": stats}


meas = _measured()
n0, h, d = meas["n0"], meas["heads"], meas["head_dim"]
rows = [[f"`{tuple(shape)}`", dtype_name(dtype), f"{math.prod(shape):,}", "**N × N**" if shape[-2:] == (n0, n0)
         else ""] for shape, dtype in meas["naive_saved"]]
shapes = Counter(tuple(shape) for shape, _ in meas["flash_saved"])
naive_peak_table = markdown_table(["N", "peak", "bytes per score"],
                                  [[f"{n:,}", kib(meas["naive_peak"][n]), f"{meas['naive_peak'][n] / (h * n * n):.1f}"]
                                   for n in meas["seqs"]])
online = _online_row()
online_table = markdown_table(["after block", "$m$", "$l$", "$l$ rescaled by"],
                              [[str(j + 1), f"{m:.2f}", f"{l:.2f}", "—" if f is None else f"{f:.2f}"]
                               for j, (m, l, f) in enumerate(online["stats"])])

# the memory check's budget, at its GPU shape (that of the H100 record's memory rows)
rec = record("flash_attention", file="h100")
mb, mh, mn, md = 1, 16, 4096, 64  # check_flash_attention_memory's shape on a GPU (bf16 where the card has it)
six_h100 = 4 * mb * mh * mn * md * 2 + 2 * mb * mh * mn * 4  # q, k, v, o in bf16 and lse, Δ in fp32
budget = math.ceil(1.05 * six_h100)
mem_rows = {r["n"]: r for r in rec["flash_attention"]["memory"]}
cpu_tensor = 1 * h * n0 * d * 4
exact = meas["flash_peak"] == 4 * cpu_tensor + 2 * h * n0 * 4 and mem_rows[mn]["reference"] == six_h100
six_exact = ("Both measurements are exactly the six tensors, to the byte: the kernels allocate nothing else"
             if exact else "The measurements differ from the six tensors: see the record")


# ------------------------------------------------------------------------------ tiles per machine


def _tiles_of(kernel: str, profile_name: str, variant: str) -> dict:
    if profile_name == "cpu":
        return KERNEL_CONFIGS[kernel]["cpu"][variant]
    return config(kernel, profile_for(profile_name))[variant]


def _tile_text(t: dict) -> str:
    return f"{t['BLOCK_M']}×{t['BLOCK_N']}, {t['num_warps']}w, {t['num_stages']}s"


tile_rows = [["`cpu` (interpreter)", "—"] + [_tile_text(_tiles_of(k, "cpu", "d64")) for k in KERNELS]]
for name in ("t4", "v100", "a100", "h100"):  # a100 has no row of its own: it reads the "gpu" row
    tile_rows.append([f"`{name}`", f"{KNOWN_GPUS[name]['shared_memory_per_block'] // KiB} KiB"] + [
        f"{_tile_text(_tiles_of(k, name, 'd64'))} / {_tiles_of(k, name, 'd128')['BLOCK_M']}×"
        f"{_tiles_of(k, name, 'd128')['BLOCK_N']}" for k in KERNELS])

# the grading plan, read from the checks
what = {
    "online_softmax": "m exact, l by the rule; huge offsets; rows that start with −∞ blocks; a one-pass "
                      "generator",
    "attention_tiled": "o and lse by the rule, several tile sizes; peak ≤ o + lse + a few tiles",
    "flash_forward": "o, lse by the rule; poisoned (NaN) outputs; shapes, dtypes, head dim > "
                     f"{ref.MAX_HEAD_DIM} raise",
    "flash_forward_memory": "peak ≤ o + lse (+5%); no PyTorch arithmetic",
    "flash_delta": "Δ = rowsum(dO ⊙ O) in fp32 by the rule; peak ≤ Δ (+5%); no PyTorch arithmetic",
    "flash_backward_dv": "dv alone by the rule, both masks (needs neither Δ nor dq)",
    "flash_backward": "dk, then dq, by the rule, both masks, with the course's Δ; peak ≤ dq, dk, dv, Δ (+5%)",
    "flash_attention_memory": "autograd on (B, N, H, d) views; forward + backward peak ≤ o, lse, Δ, "
                              "dq, dk, dv (+5%)",
}
checks_table = markdown_table(["check", "points", "what it tests"],
                              [[f"`{c.name}`", f"{c.points:g}", what[c.name]] for c in checks.CHECKS])
visible = [c for c in checks.ATTN_CASES if not c.hidden]

# the recorded speed run
speed = rec["flash_attention"]["speed"]
mem = rec["flash_attention"]["memory"]
big = mem[-1]


def _ranges(rows, key, pass_):
    vals = [r[key] for r in rows if r["pass_"] == pass_ and r[key] is not None]
    return f"{min(vals):.2f}–{max(vals):.2f}×"


# the H200 run: cuDNN in the same process, and a profile of one causal forward + backward
h200 = record("flash_attention", file="flash-attention.json")  # the newest full run (not a sweep)
if not h200["flash_attention"].get("profile"):
    raise RuntimeError(f"{h200['path']} has no profile: run python -m benchmarks.flash_attention on a GPU")
h200_speed = h200["flash_attention"]["speed"]
h200_table = markdown_table(
    ["pass", "d", "ours / cuDNN", "ours / SDPA flash"],
    [[pass_, f"{d_}", _ranges([r for r in h200_speed if r["d"] == d_], "vs_cudnn", pass_),
      _ranges([r for r in h200_speed if r["d"] == d_], "vs_flash", pass_)]
     for pass_ in ("forward", "forward + backward") for d_ in sorted({r["d"] for r in h200_speed})])
h200_profile_n = h200["flash_attention"]["profile"][0]["n"]


def _kernel_label(name: str) -> str:
    """cuDNN's generated kernel names, shortened to what they compute."""
    for tag, label in (("bprop", "cuDNN backward"), ("fprop", "cuDNN forward"), ("dot_do_o", "cuDNN Δ"),
                       ("convert_dq", "cuDNN dQ to 16 bits")):
        if tag in name:
            return label
    return name.split("(")[0][:40]


h200_profile_table = markdown_table(
    ["d", "implementation", "ms", "kernels (ms)"],
    [[f"{r['d']}", r["impl"], f"{sum(r['kernels_ms'].values()):.2f}",
      ", ".join(f"{_kernel_label(k)} {v:.2f}" for k, v in r["kernels_ms"].items() if v >= 0.1)]
     for r in h200["flash_attention"]["profile"]])

# the tile sweep
sweep_rec = record("flash_attention", file="sweep")


def _sweep_row(kernel: str) -> dict:
    """memfit.hardware's H100 tiles for a kernel (one for both head-dim classes), their total ms over the sweep's
    four cases (d 64 and 128, causal and not), the runner-up's total, and the worst case against that case's best."""
    sweep = [r for r in sweep_rec["flash_attention"]["sweep"] if r["kernel"] == kernel]
    t = _tiles_of(kernel, "h100", "d64")
    chosen = (t["BLOCK_M"], t["BLOCK_N"], t["num_warps"], t["num_stages"])
    totals: dict[tuple, float] = {}
    for r in sweep:
        totals[tuple(r["tiles"])] = totals.get(tuple(r["tiles"]), 0.0) + r["ms"]
    worst = 1.0
    for case in ([r for r in sweep if r["d"] == d_ and r["causal"] == causal]
                 for d_ in sorted({r["d"] for r in sweep}) for causal in (False, True)):
        mine = next(r["ms"] for r in case if tuple(r["tiles"]) == chosen)
        worst = max(worst, mine / min(r["ms"] for r in case))
    runner_up_total, runner_up = sorted((v, k) for k, v in totals.items() if k != chosen)[0]
    return {"kernel": kernel, "chosen": chosen, "total": totals[chosen], "best": min(totals, key=totals.get),
            "runner_up": runner_up, "runner_up_total": runner_up_total, "worst": worst}


sweeps = [_sweep_row(k) for k in KERNELS]
sweep_claim = ("in every kernel the smallest total" if all(r["chosen"] == r["best"] for r in sweeps)
               else "not always the smallest total")
sweep_table = markdown_table(["kernel", "memfit's tiles", "Σ ms", "runner-up", "Σ ms",
                              "worst case vs that case's best"],
                             [[f"`{r['kernel']}`", f"{r['chosen']}", f"{r['total']:.2f}", f"{r['runner_up']}",
                               f"{r['runner_up_total']:.2f}", f"{100 * (r['worst'] - 1):.0f}%"] for r in sweeps])
sweep_n = "4,096"


# ------------------------------------------------------------------------------------------ figures

def fig_s2_context():
    """Per-layer bytes of Llama-3.1-8B against context: Korthikanti's 5·b·s²·a against lesson 02's whole block."""
    seqs = [2 ** k for k in range(10, 18)]
    five = [5 * s * s * cfg.n_heads / 2**30 for s in seqs]
    fig, ax = figure(figsize=(7.4, 5.2))
    for ys, style, label in ((five, "o-", "5·b·s²·a (Korthikanti's attention)"),
                             ([activation_bytes(cfg, 1, s, "amp") / 2**30 for s in seqs], "s-",
                              "whole block with flash (lesson 02)"),
                             ([4 * s * cfg.n_heads / 2**30 for s in seqs], "^-", "flash's logsumexp: 4·b·s·a")):
        color = {"o-": COLORS["activations"], "s-": COLORS["params"], "^-": COLORS["optimizer"]}[style]
        ax.loglog(seqs, ys, style, color=color, lw=2.5, label=label, base=2)
    ax.set_yscale("log", base=10)
    ax.plot([s2["s"]], [s2["five"] / 2**30], "o", ms=16, mfc="none", mec="black", mew=2)
    ax.annotate(f"s = {s2['s'] // 1024}K: {s2['five'] / 2**30:.0f} GiB\nper layer", (s2["s"], s2["five"] / 2**30),
                xytext=(30, -75), textcoords="offset points", fontsize=15,
                arrowprops=dict(arrowstyle="->", color="black"))
    ax.set_xticks(seqs)
    ax.set_xticklabels([f"{s // 1024}K" for s in seqs])
    ax.set(xlabel="context length s (batch 1)", ylabel="GiB per layer")
    ax.set_title(f"{cfg.name}, {cfg.n_heads} heads", fontsize=15)
    ax.legend(loc="upper left", fontsize=13, frameon=False, borderaxespad=0.2)
    ax.set_ylim(top=max(five) * 3e3)
    return fig


def fig_online_softmax():
    """One row read in four blocks of 16 by the lesson's online_softmax_stats: each block's scores and the running max m
    after it (the numbers are in the slide's table)."""
    x, width = online["x"], online["width"]
    fig, ax = figure(figsize=(7.6, 5.0))
    block_colors = [COLORS["params"], COLORS["grads"], COLORS["optimizer"], COLORS["ours"]]
    for j, (m, _l, _f) in enumerate(online["stats"]):
        cols = list(range(j * width, (j + 1) * width))
        ax.plot(cols, x[j * width:(j + 1) * width], "o", color=block_colors[j], ms=8, label=f"block {j + 1}")
        if j:
            ax.axvline(j * width - 0.5, color=COLORS["neutral"], lw=1, ls=":")
        ax.hlines(m, j * width - 0.5, (j + 1) * width - 0.5, color=COLORS["activations"], lw=3.5)
        ax.text(j * width + width / 2 - 0.5, m + 0.25, f"m{j + 1}", color=COLORS["activations"], ha="center",
                va="bottom", fontsize=15)
    ax.set(xlabel="column of one row of scores", ylabel="score",
           xticks=[j * width for j in range(len(online["stats"]) + 1)],
           ylim=(min(x) - 0.6, max(m for m, _, _ in online["stats"]) + 1.3))
    ax.set_title("red: the running max m after each block", fontsize=15, color=COLORS["activations"])
    ax.grid(axis="x", visible=False)
    return fig


def _causal_tiles(n: int, block_m: int, block_n: int) -> list[tuple[int, int, str]]:
    """(start_m, start_n, kind) for every tile of the (n x n) scores, kind in full / masked / skipped, following the
    causal forward kernel's loop bounds (lesson section 4): keys [0, start_m) unmasked, the diagonal range
    [start_m, min(start_m + BLOCK_M, n)) masked."""
    return [(start_m, start_n, "full" if start_n < start_m else
             ("masked" if start_n < min(start_m + block_m, n) else "skipped"))
            for start_m in range(0, n, block_m) for start_n in range(0, n, block_n)]


def fig_tiling():
    """The causal forward at N = 100 (no multiple of the tiles) with the interpreter's tiles: which (BLOCK_M x BLOCK_N)
    tiles of S the kernel computes without a mask, with a mask, or skips; programs take query blocks from the end."""
    n = TILING_N
    t = _tiles_of("flash_forward", "cpu", "d64")
    bm, bn = t["BLOCK_M"], t["BLOCK_N"]
    tiles = _causal_tiles(n, bm, bn)
    colors = {"full": COLORS["params"], "masked": COLORS["grads"], "skipped": "white"}
    fig, ax = figure(figsize=(6.0, 6.4))
    ax.grid(False)
    for start_m, start_n, kind in tiles:
        w, hgt = min(bn, n - start_n), min(bm, n - start_m)
        ax.add_patch(patches.Rectangle((start_n, start_m), w, hgt, facecolor=colors[kind], edgecolor="#555",
                                       lw=1.0, alpha=0.85 if kind != "skipped" else 1))
    ax.plot([0, n], [0, n], color=COLORS["activations"], lw=2.5)
    starts = list(range(0, n, bm))
    for i, start_m in enumerate(starts):
        rows_ = min(bm, n - start_m)
        label = f"program {len(starts) - 1 - i}" + (f" ({rows_} rows)" if rows_ < bm else "")
        ax.text(-3, start_m + rows_ / 2, label, ha="right", va="center", fontsize=17)
    counts = {k: sum(1 for *_, kind in tiles if kind == k) for k in colors}
    handles = [patches.Patch(facecolor=colors[k], edgecolor="#555", label=f"{label}: {counts[k]}")
               for k, label in (("full", "unmasked"), ("masked", "masked"), ("skipped", "skipped"))]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.4, -0.02), ncol=3, fontsize=17,
              frameon=False, handlelength=1.0, columnspacing=0.8, handletextpad=0.4)
    ax.set(xlim=(-1, n + 1), ylim=(n + 1, -1), aspect="equal", xticks=list(range(0, n, 2 * bn)), yticks=[])
    ax.tick_params(axis="x", labelsize=15)
    ax.xaxis.set_ticks_position("top")
    ax.xaxis.set_label_position("top")
    ax.set_xlabel(f"N = {n}: keys in blocks of {bn},\nqueries in blocks of {bm}", fontsize=17)
    ax.spines[["left", "bottom", "right"]].set_visible(False)
    return fig


def fig_backward():
    """The two backward loops over one causal score matrix of 6 x 6 blocks (a sketch): a flash_dkdv program owns a key
    block and walks down the query blocks from the diagonal; a flash_dq program owns a query block and walks across
    the key blocks up to the diagonal."""
    blocks, key_block, query_block = 6, 1, 4
    fig, ax = figure(figsize=(5.6, 6.2))
    ax.grid(False)
    ax.set_aspect("equal")
    ax.axis("off")
    dkdv, dq = COLORS["optimizer"], COLORS["ours"]
    for i in range(blocks):
        for j in range(blocks):
            face = "white" if j > i else "#ececec"
            if j == key_block and i >= j:
                face = dkdv
            if i == query_block and j <= i:
                face = dq
            ax.add_patch(patches.Rectangle((j, i), 0.94, 0.94, facecolor=face, edgecolor="#777", lw=0.8,
                                           hatch="//" if i == j and face != "#ececec" else None))
    ax.plot([0, blocks], [0, blocks], color=COLORS["activations"], lw=2)
    arrow(ax, (key_block + 0.47, key_block + 0.25), (key_block + 0.47, blocks - 0.05), lw=3, color="black")
    arrow(ax, (0.05, query_block + 0.47), (query_block + 0.9, query_block + 0.47), lw=3, color="black")
    ax.text(blocks / 2, -0.15, "keys →", ha="center", va="bottom", fontsize=18)
    ax.text(-0.15, blocks / 2, "queries →", ha="right", va="center", rotation=90, fontsize=18)
    handles = [patches.Patch(facecolor=dkdv, edgecolor="#777", label="flash_dkdv: a key block"),
               patches.Patch(facecolor=dq, edgecolor="#777", label="flash_dq: a query block"),
               patches.Patch(facecolor="white", edgecolor="#777", hatch="//", label="diagonal: masked")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(-0.02, 0.02), fontsize=18, frameon=False)
    ax.set(xlim=(-0.7, blocks + 0.1), ylim=(blocks + 0.1, -0.7))
    return fig


def fig_memory():
    """The recorded H100 run: peak extra memory of forward + backward against N, log-log, with each line's slope."""
    ns = [r["n"] for r in mem]
    fig, ax = figure(figsize=(7.6, 5.0))
    for key, label, color, marker in (("naive", "naive attention", COLORS["activations"], "o"),
                                      ("SDPA flash", "SDPA flash", IMPL_COLORS["SDPA flash"], "s"),
                                      ("reference", "the lesson's flash_attention", IMPL_COLORS["reference"], "^")):
        ys = [r[key] / 2**20 for r in mem]
        slope = math.log(ys[-1] / ys[0]) / math.log(ns[-1] / ns[0])
        ax.loglog(ns, ys, marker=marker, ls="-", lw=2.5, ms=8, color=color, label=f"{label} (slope {slope:.2f})",
                  base=2)
    ax.set_yscale("log", base=10)
    ax.set_ylim(top=max(r["naive"] for r in mem) / 2**20 * 40)
    ax.set_xticks(ns)
    ax.set_xticklabels([f"{n:,}" for n in ns])
    ax.set(xlabel="sequence length N", ylabel="MiB, forward + backward")
    ax.set_title(f"{rec['device']}: B={MEMORY_RUN['B']}, H={MEMORY_RUN['H']}, d={MEMORY_RUN['d']}, bf16, causal",
                 fontsize=14)
    ax.legend(loc="upper left", fontsize=12.5, framealpha=0.95)
    return fig


def fig_speed():
    """The recorded H100 run at the longest N: TFLOP/s of the lesson's kernels and SDPA's two backends, forward and
    forward + backward, for head dims 64 and 128, causal or not."""
    top_n = max(r["n"] for r in speed)
    fig, axes = figure(ncols=2, figsize=(12, 4.6), sharey=True)
    for ax, pass_ in zip(axes, ("forward", "forward + backward")):
        shown = sorted((r for r in speed if r["n"] == top_n and r["pass_"] == pass_),
                       key=lambda r: (r["d"], r["causal"]))
        width = 0.27
        for k, impl in enumerate(IMPLS):
            ax.bar([i + (k - 1) * width for i in range(len(shown))], [r["tflops"][impl] for r in shown], width,
                   color=IMPL_COLORS[impl], label=IMPL_LABELS[impl] if pass_ == "forward" else None)
        ax.set_xticks(range(len(shown)))
        ax.set_xticklabels([f"d={r['d']}\n{'causal' if r['causal'] else 'full'}" for r in shown])
        ax.set_title(pass_, fontsize=15)
        ax.grid(axis="x", visible=False)
    axes[0].set_ylabel("TFLOP/s")
    axes[0].set_ylim(0, 1.18 * max(r["tflops"][i] for r in speed for i in IMPLS))
    fig.legend(loc="upper center", ncol=3, fontsize=13, frameon=False, bbox_to_anchor=(0.5, 1.07))
    fig.suptitle(f"B=4, H=32, N={top_n:,}, bf16", y=-0.02, fontsize=13)
    return fig
