"""Lesson 03's deck: ZeRO-1/2/3 with the lesson's reference code (shard_bounds, ZeroAdamW, zero_bytes_per_rank,
comm_bytes_per_rank, deepspeed_zero3_estimate, prefetch_timeline), the course-tiny GPT trained on simulated ranks
here and now, the recorded 2 x H200 NCCL run (record "zero"), and the lesson's own demo cells for the offload
cost model and the prefetch scenario (run from the solution notebook, so their assumptions are the lesson's)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from pathlib import Path

import matplotlib.patches as patches
import matplotlib.pyplot as plt
import torch

from autograder.checks.zero import CHECKS, DEEPSPEED_ESTIMATOR_RUNS, OPT_ARGS, PAPER, REL_TOL  # noqa: F401
from memfit.gpt import COURSE_CONFIGS, LLAMA_3_1_8B
from memfit.meter import format_bytes
from memfit.zero import FlatModel, engine_peak_bytes, reference_training, simulate, train_ranks
from slides.figures import (COLORS, arrow, canvas, figure, gb, gib, lanes, lesson, limit, markdown_table,  # noqa: F401
                            measured_on, record, source, stacked)

V100_BYTES = 32e9  # a V100 of 32 GB (NVIDIA's datasheet): the card of the lesson's offload example

LESSON = "03_zero"
NOTEBOOK = Path(__file__).resolve().parents[2] / "solutions" / f"{LESSON}.ipynb"
# The lesson's settings: data parallelism over one node of 8 GPUs of a nominal 80 GB (an H100 node), and the ZeRO
# paper's example (Rajbhandari et al., 2020, Figure 1): 7.5B parameters on 64 GPUs.
DP_GPUS, CARD_BYTES = 8, 80e9
PAPER_PSI, PAPER_N = 7_500_000_000, 64
SIM_RANKS, SIM_STEPS = 4, 2  # the simulated demo: 4 ranks as the lesson's; 2 steps (the checks' number) for speed
STAGE_NAMES = ["DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
RANK_COLORS = [COLORS["params"], COLORS["grads"], COLORS["optimizer"], COLORS["activations"]]
ref = lesson(LESSON)


@contextlib.contextmanager
def _one_thread():
    """The simulated ranks are threads of this process: one intra-op thread each keeps a shared CPU from thrashing."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------------------ the lesson's notebook itself

def _cell(cells: list[dict], marker: str) -> str:
    found = ["".join(c["source"]) for c in cells if c["cell_type"] == "code" and marker in "".join(c["source"])]
    if len(found) != 1:
        raise RuntimeError(f"{NOTEBOOK.name}: expected one code cell containing {marker!r}, found {len(found)}")
    return found[0]


def _demos() -> dict:
    """Run the lesson's demo cells for the 8B example, DeepSpeed's estimate, the offload cost model and the prefetch
    scenario, in one namespace that starts from the graded code (as the notebook runs them, minus the printing).
    prefetch_timeline is wrapped so that every call the prefetch demo makes is kept with its inputs and result."""
    ns = dict(vars(ref))
    ns.update(plt=plt, os=os)
    calls = []
    timeline = ns["prefetch_timeline"]

    def recorded(compute_ms, gather_ms, unit_bytes, prefetch=1):
        out = timeline(compute_ms, gather_ms, unit_bytes, prefetch=prefetch)
        calls.append(dict(compute_ms=list(compute_ms), gather_ms=list(gather_ms), unit_bytes=list(unit_bytes),
                          prefetch=prefetch, **out))
        return out

    ns["prefetch_timeline"] = recorded
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    markers = ["ZeRO paper, Ψ = 7.5B", "DeepSpeed's \"largest layer\"", "def offload_step_seconds",
               "prefetch_timeline([c] * units"]
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for marker in markers:
            exec(compile(_cell(cells, marker), f"{NOTEBOOK.name}: demo cell with {marker!r}", "exec"), ns)
    titles = [ax.get_title() for row in ns["axes"] for ax in row]
    plt.close(ns["fig"])
    for call in calls:  # the demo's panel titles name the link each call models
        mine = [t for t in titles if f"prefetch {call['prefetch']}: {call['total_ms']:.0f} ms" in t]
        if len(mine) != 1:
            raise RuntimeError(f"{NOTEBOOK.name}: cannot tell which panel of the prefetch demo shows {call}")
        call["link"] = mine[0].split(", prefetch")[0]
    ns["prefetch_calls"] = calls
    return ns


# --------------------------------------------------------------------------------------- the computations

def _simulated() -> dict:
    """The lesson's demo: the course-tiny GPT on SIM_RANKS simulated ranks, each stage, against unsharded AdamW."""
    with _one_thread():
        want = reference_training(SIM_RANKS, steps=SIM_STEPS, opt_args=OPT_ARGS)
        rows = []
        for stage in range(4):
            reports = simulate(SIM_RANKS, lambda comm, s=stage: train_ranks(ref.ZeroAdamW, comm, s, steps=SIM_STEPS,
                                                                           opt_args=OPT_ARGS))
            rows.append((stage, torch.equal(reports[0].final, want), reports[0]))
    return {"numel": FlatModel.of(COURSE_CONFIGS["tiny"]).numel, "rows": rows}


def _collective_bytes(comm) -> dict[str, int]:
    """What one rank sends in each collective on 3 simulated ranks, for a 24-byte fp32 tensor (the lesson's demo)."""
    full = torch.full((6,), float(comm.rank + 1))
    calls = {"all_reduce": lambda: comm.all_reduce(full.clone()),
             "reduce_scatter": lambda: comm.reduce_scatter(torch.empty(2), full.clone()),
             "all_gather": lambda: comm.all_gather(torch.empty(6), full[:2].clone())}
    out = {}
    for name, call in calls.items():
        before = comm.sent_bytes
        call()
        out[name] = comm.sent_bytes - before
    return out


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"  # the table's header says MiB


def _ranks(values: list[int]) -> str:
    return " / ".join(dict.fromkeys(_mib(v) for v in values))


def _short_engine(row: dict) -> str:
    name = row["engine"]
    if name.startswith("ZeroAdamW"):
        return f"ours, stage {name.split()[-1]}"
    return "FSDP2 per block" if name.startswith("FSDP2") else "ZeroRedundancyOpt."


# ---------------------------------------------------------------- what the deck quotes ({{ name }} in its Markdown)

ns = _demos()
n8b = ns["n8b"]

# title and motivation
dp = ref.zero_bytes_per_rank(0, n8b, 1)
stages8 = [ref.zero_bytes_per_rank(s, n8b, DP_GPUS)["total"] for s in range(4)]
stage8_z1, stage8_z2, stage8_z3 = (gb(t) for t in stages8[1:])

# exercise 1: shards
lo, hi = ref.shard_bounds(10, 4, 3)
lo8, hi8 = ref.shard_bounds(n8b, DP_GPUS, DP_GPUS - 1)

# collectives
collective_sent = simulate(3, _collective_bytes)[0]
ar_sent, rs_sent, ag_sent = (f"{collective_sent[k]} B" for k in ("all_reduce", "reduce_scatter", "all_gather"))

# the simulated demo
sim = _simulated()
sim_table = markdown_table(["stage", "bitwise = AdamW", "params", "grads", "optimizer", "at rest", "peak",
                            "sent / step"],
                           [[STAGE_NAMES[stage], "yes" if equal else "**no**"]
                            + [format_bytes(r.buffers[k]) for k in ("params", "grads", "optimizer")]
                            + [format_bytes(r.at_rest), format_bytes(r.peak), format_bytes(r.sent_per_step)]
                            for stage, equal, r in sim["rows"]])
rests = [r.at_rest for _, _, r in sim["rows"]]
peaks = [r.peak for _, _, r in sim["rows"]]

# exercise 3: the paper's example
paper = [ref.zero_bytes_per_rank(s, PAPER_PSI, PAPER_N)["total"] for s in range(4)]
paper_table = markdown_table(["stage", "`zero_bytes_per_rank`", "the paper"],
                             [[STAGE_NAMES[s], gb(paper[s]), f"{v} GB"] for s, v in PAPER])

# exercise 4: communication
comm8 = [ref.comm_bytes_per_rank(s, n8b, DP_GPUS) for s in range(4)]

# the recorded run
rec = record("zero")
body = rec["zero"]
numel, world = body["params"], body["world_size"]
table = []
for row in body["rows"]:
    if row["dtype"] != "float32":
        continue
    stage = 3 if "ZeRO-3" in row["engine"] else 1 if "ZeRO-1" in row["engine"] else int(row["engine"].split()[-1])
    states = ref.zero_bytes_per_rank(stage, numel, world, 4, 4, 8)["total"]
    if row["engine"].startswith("ZeroAdamW"):
        transient = engine_peak_bytes(stage, numel, world, 4, 4)
        peak_pred = f"{_mib(states + transient['transient'])} ({transient['moment']})"
        sent = _mib(row["sent_per_step"])
    else:
        peak_pred, sent = "n/a", "n/a"
    table.append([_short_engine(row), _mib(states), _ranks(row["at_rest"]), peak_pred, _ranks(row["peak"]), sent])
rec_table = markdown_table(["fp32, MiB per rank", "at rest: formula", "measured", "peak: predicted", "measured",
                            "sent / step"], table)
ours = [r for r in body["rows"] if r["engine"].startswith("ZeroAdamW")]
deviation = max(abs(m - r[f"predicted_{k}"]) for r in ours for k in ("at_rest", "peak") for m in r[k])
errors = [r["max_rel_error"] for r in body["rows"] if r["max_rel_error"] is not None]
rec_match = ("the same weights as unsharded AdamW, bit for bit" if max(errors) == 0 else
             f"within {max(errors):.1e} of unsharded AdamW")
fsdp = next(r for r in body["rows"] if r["engine"].startswith("FSDP2"))
ours3 = next(r for r in body["rows"] if r["engine"] == "ZeroAdamW stage 3" and r["dtype"] == "float32")
zro = next(r for r in body["rows"] if r["engine"].startswith("ZeroRedundancy"))
inv = zro["inventory"]

# exercise 6: DeepSpeed's estimator
largest = ns["largest"]
if largest != LLAMA_3_1_8B.vocab_size * LLAMA_3_1_8B.d_model:
    raise RuntimeError("the deck says Llama-3.1-8B's largest layer is its embedding: it no longer is")
settings = [("8 GPUs, no offload", 8, dict(offload_optimizer=False, offload_params=False)),
            ("4 GPUs, no offload", 4, dict(offload_optimizer=False, offload_params=False)),
            ("4 GPUs, optimizer on the CPU", 4, dict(offload_params=False))]
rows = []
for label, gpus, kwargs in settings:
    cpu, gpu = ref.deepspeed_zero3_estimate(n8b, largest, gpus_per_node=gpus, **kwargs)
    rows.append([label, gib(gpu, 2), gib(cpu, 2) if kwargs.get("offload_optimizer", True) else "–",
                 "yes" if gpu < V100_BYTES else "**no**"])
ds_table = markdown_table(["one node of V100s", "per GPU", "per CPU", f"fits {gb(V100_BYTES, 0)}"], rows)
for kwargs, which, printed in DEEPSPEED_ESTIMATOR_RUNS:  # the check's printed values, from the same code
    cpu, gpu = ref.deepspeed_zero3_estimate(n8b, largest, **kwargs)
    if round((cpu if which == "cpu" else gpu) / 2**30, 2) != printed:
        raise RuntimeError(f"the lesson's estimator no longer prints DeepSpeed's {printed} GiB for {kwargs}")
_, off_gpu = ref.deepspeed_zero3_estimate(n8b, largest, gpus_per_node=4, offload_params=False)

# the offload cost model, as the lesson's demo cell computes it
gpu8, gpu4, transfer = ns["gpu_seconds"](8), ns["gpu_s"], ns["transfer"]
measured, recorded, pcie = ns["measured"], ns["recorded"], ns["pcie"]
off_gpu8, off_gpu_fact, off_pcie = (f"{v:.1f} s" for v in (gpu8, gpu4, transfer))

# exercise 7: prefetch
calls = ns["prefetch_calls"]
c = calls[0]["compute_ms"][0]
slow = next(x for x in calls if x["gather_ms"][0] > c)
fast = next(x for x in calls if x["gather_ms"][0] <= c)

# grading
points = {c_.name: f"{c_.points:g}" for c_ in CHECKS}


# ------------------------------------------------------------------------------------------------- figures

def fig_stages_8b():
    """Llama-3.1-8B's model states per GPU, DP and ZeRO-1/2/3 on 8 GPUs, against an 80 GB card."""
    fig, ax = figure(figsize=(6.4, 5.4))
    parts = [([ref.zero_bytes_per_rank(s, n8b, DP_GPUS)[key] / 1e9 for s in range(4)], COLORS[key], label)
             for key, label in (("params", "parameters (bf16)"), ("grads", "gradients (bf16)"),
                                ("optimizer", "optimizer (fp32 master, m, v)"))]
    totals = stacked(ax, STAGE_NAMES, parts, width=0.62)
    for i, total in enumerate(totals):
        ax.text(i, total + 2, f"{total:.1f}", ha="center", va="bottom", fontsize=14)
    limit(ax, CARD_BYTES / 1e9, f"one {CARD_BYTES / 1e9:.0f} GB GPU", (3.4, CARD_BYTES / 1e9 + 2), vertical=False,
          lw=2, ha="right", va="bottom", fontsize=15)
    ax.set(ylabel="GB per GPU (model states)", ylim=(0, max(totals) * 1.12),
           title=f"Llama-3.1-8B, mixed precision, N = {DP_GPUS}")
    ax.legend(loc="upper right", bbox_to_anchor=(1.02, 0.99), frameon=False, fontsize=13)
    ax.grid(axis="x", visible=False)
    return fig


def fig_shards():
    """A flat vector of 10 elements on 4 ranks: shards of ceil(10/4) = 3, the last one padded."""
    numel, n = 10, 4
    size = ref.shard_bounds(numel, n, 0)[1]
    fig, ax = canvas(figsize=(10, 2.7))
    for r in range(n):
        lo, hi = ref.shard_bounds(numel, n, r)
        lanes(ax, [RANK_COLORS[r]] * (hi - lo), numel, fontsize=14, lw=2, pad="pad", first=lo)
        ax.text((lo + hi) / 2 - 0.04, 1.2, f"rank {r}: [{lo}, {hi})", ha="center", fontsize=15, color=RANK_COLORS[r])
    ax.text(n * size / 2, -0.45, f"Ψ = {numel} elements, N = {n} ranks: shards of ⌈{numel}/{n}⌉ = {size}, "
            f"{n * size - numel} of padding", ha="center", fontsize=14, color="#555555")
    ax.set(xlim=(-0.2, n * size + 0.2), ylim=(-0.7, 1.55))
    return fig


def fig_collectives():
    """The three collectives on 3 ranks, a vector of 3 chunks: before and after, and what each rank sends."""
    fig, ax = canvas(figsize=(12, 4.6))
    n, cell, step = 3, 0.5, 0.58
    sigma = COLORS["ours"]

    def grid(x0, cells):
        """cells[r][j] = (color or None, text): rank r's chunk j."""
        for r in range(n):
            for j in range(n):
                color, text = cells[r][j]
                x, y = x0 + j * step, -r * step
                ax.add_patch(patches.Rectangle((x, y), cell, cell, lw=1.5, facecolor=color or "white",
                                               edgecolor=color or "#bbbbbb", ls="-" if color else ":"))
                if text:
                    ax.text(x + cell / 2, y + cell / 2, text, ha="center", va="center", fontsize=13, color="white")

    own = [[(RANK_COLORS[r], f"x{r}") for _ in range(n)] for r in range(n)]
    rows = [("all_reduce", own, [[(sigma, "Σ") for _ in range(n)] for _ in range(n)], "every rank: the sum"),
            ("reduce_scatter", own, [[(sigma, "Σ") if j == r else (None, "") for j in range(n)] for r in range(n)],
             "rank r: chunk r of the sum"),
            ("all_gather", [[(RANK_COLORS[r], f"x{r}") if j == r else (None, "") for j in range(n)] for r in range(n)],
             [[(RANK_COLORS[j], f"x{j}") for j in range(n)] for _ in range(n)], "every rank: every chunk")]
    width = n * step
    for k, (name, before, after, what) in enumerate(rows):
        x = k * (2 * width + 1.25)
        mid = x + width + 0.3
        ax.text(mid, 0.85, name, ha="center", fontsize=17, family="monospace")
        grid(x, before)
        arrow(ax, (x + width + 0.05, -0.33), (x + width + 0.5, -0.33), color="#555555")
        grid(x + width + 0.6, after)
        ax.text(mid, -1.65, what, ha="center", fontsize=14)
        ax.text(mid, -2.05, f"each rank sends {collective_sent[name]} B", ha="center", fontsize=14,
                color=COLORS["activations"])
    for r in range(n):
        ax.text(-0.12, -r * step + cell / 2, f"rank {r}", ha="right", va="center", fontsize=13)
    ax.set(xlim=(-1.0, 3 * (2 * width + 1.25) - 0.9), ylim=(-2.3, 1.2))
    return fig


def fig_step_flow():
    """What one step does on one rank, stage by stage (the lesson's section 3), and what the rank keeps."""
    width, height = 14.5, 4.3
    fig, ax = figure(figsize=(width, height))
    ax.set_position([0, 0, 1, 1])  # one data unit = one inch: text widths measure in the same units as the boxes
    ax.set(xlim=(0, width), ylim=(-height, 0))
    ax.grid(False)
    ax.axis("off")
    kinds = {"compute": ("#b9c4d6", "#1f2d3d"), "comm": (COLORS["grads"], "white"),
             "update": (COLORS["optimizer"], "white")}
    fwd, bwd = ("forward", "compute"), ("backward", "compute")
    flows = [
        [fwd, bwd, ("all-reduce grads, ÷N", "comm"), ("AdamW on all Ψ", "update")],
        [fwd, bwd, ("reduce-scatter grads, ÷N", "comm"), ("AdamW on own shard", "update"),
         ("all-gather params", "comm")],
        [fwd, ("backward, reduce-scatter into grad shard, ÷N", "comm"), ("AdamW on own shard", "update"),
         ("all-gather params", "comm")],
        [("all-gather params", "comm"), fwd, ("free, all-gather again", "comm"), bwd,
         ("reduce-scatter, ÷N", "comm"), ("AdamW on own shard", "update")],
    ]
    keeps = ["keeps P, G, K", "keeps P, G, K/N", "keeps P, G/N, K/N", "keeps P/N, G/N, K/N"]
    renderer = fig.canvas.get_renderer()
    to_data = ax.transData.inverted()
    pad, gap, box_h, left = 0.22, 0.07, 0.55, 1.35
    for s, flow in enumerate(flows):
        y = -0.2 - s * 0.85 - box_h
        ax.text(left - 0.12, y + box_h / 2, STAGE_NAMES[s], ha="right", va="center", fontsize=15, weight="bold")
        x = left
        for label, kind in flow:
            face, ink = kinds[kind]
            text = ax.text(x, y + box_h / 2, label, ha="center", va="center", fontsize=14, color=ink, zorder=3)
            w = 1.08 * text.get_window_extent(renderer).transformed(to_data).width + pad  # the SVG sets text wider
            text.set_x(x + w / 2)
            ax.add_patch(patches.FancyBboxPatch((x, y), w, box_h, boxstyle="round,pad=0.0,rounding_size=0.06",
                                                facecolor=face, edgecolor="none"))
            x += w + gap
        ax.text(x + 0.12, y + box_h / 2, keeps[s], ha="left", va="center", fontsize=14, color="#555555")
    handles = [patches.Patch(color=kinds[k][0], label=lab) for k, lab in
               (("compute", "compute"), ("comm", "collective"), ("update", "optimizer"))]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(left / width, 0.0), ncol=3, frameon=False,
              fontsize=14)
    return fig


def fig_mem_vs_comm():
    """The lesson's chart: Llama-3.1-8B's states per rank against the bytes a rank sends per step, N = 8 and 64."""
    fig, ax = figure(figsize=(6.4, 5.4))
    for n, marker, color, side in ((DP_GPUS, "o", COLORS["params"], -1), (PAPER_N, "s", COLORS["grads"], 1)):
        mem = [ref.zero_bytes_per_rank(s, n8b, n)["total"] / 1e9 for s in range(4)]
        comm = [ref.comm_bytes_per_rank(s, n8b, n) / 1e9 for s in range(4)]
        ax.plot(comm, mem, marker=marker, ms=9, lw=2, color=color, label=f"N = {n}")
        for s in range(4):
            where = 1 if s == 3 else side  # ZeRO-3 sits alone at the right: its label goes there
            ax.annotate(STAGE_NAMES[s], (comm[s], mem[s]), textcoords="offset points", xytext=(where * 9, 0),
                        fontsize=14, color=color, ha="left" if where > 0 else "right", va="center")
    ax.set(xlabel="GB sent per rank per step", ylabel="model states per rank (GB)", yscale="log")
    lo, hi = ax.get_xlim()
    ax.set_xlim(lo - 0.35 * (hi - lo), hi + 0.2 * (hi - lo))
    ax.legend(loc="upper right")
    return fig


def fig_measured():
    """The recorded 2-GPU NCCL run: each rank's bytes at rest and at peak, measured, with the formulas' marks."""
    rows = body["rows"]
    fig, ax = figure(figsize=(10, 4.3))
    labels, w = [], 0.38
    for i, row in enumerate(rows):
        rest, peak = max(row["at_rest"]) / 2**30, max(row["peak"]) / 2**30
        ax.bar(i - w / 2, rest, w, color=COLORS["params"], label="at rest, measured" if i == 0 else None)
        ax.bar(i + w / 2, peak, w, color=COLORS["grads"], label="peak, measured" if i == 0 else None)
        ax.plot([i - w, i], [row["predicted_at_rest"] / 2**30] * 2, color="black", lw=2.5,
                label="predicted" if i == 0 else None)
        if "predicted_peak" in row:
            ax.plot([i, i + w], [row["predicted_peak"] / 2**30] * 2, color="black", lw=2.5)
        if row["engine"].startswith("ZeroAdamW"):
            labels.append(f"stage {row['engine'].split()[-1]}\n{'fp32' if row['dtype'] == 'float32' else 'bf16'}")
        else:
            labels.append("ZeRO\nRedund." if "Redundancy" in row["engine"] else "FSDP2")
    ax.set_xticks(range(len(rows)), labels, fontsize=12)
    for x in (3.5, 7.5):
        ax.axvline(x, color="#cccccc", lw=1)
    ax.set_ylabel(f"GiB per rank, course-{body['model']}")
    ax.legend(loc="upper right", ncol=3, frameon=False, bbox_to_anchor=(1.0, 1.03), fontsize=12.5,
              handlelength=1.5, columnspacing=1.2)
    ax.set_ylim(0, max(max(r["peak"]) for r in rows) / 2**30 * 1.2)
    ax.grid(axis="x", visible=False)
    return fig


def fig_offload_time():
    """The lesson's cost model: a step on 8 V100s without offload, and on 4 with the optimizer on the CPU, split into
    GPU compute, PCIe and CPU AdamW at the course's recorded 32-core rate."""
    fig, ax = figure(figsize=(10, 3.6))
    ax.barh([1], [gpu8], color=COLORS["params"], height=0.55)
    ax.text(gpu8 + 0.2, 1, f"{gpu8:.1f} s: GPU compute", va="center", fontsize=14)
    left = 0.0
    for value, color, label in ((gpu4, COLORS["params"], "GPU"), (transfer, COLORS["grads"], "PCIe"),
                                (n8b / recorded, COLORS["optimizer"], "CPU AdamW")):
        ax.barh([0], [value], left=left, color=color, height=0.55)
        if value > 2:
            ax.text(left + value / 2, 0, f"{label} {value:.1f} s", ha="center", va="center", color="white",
                    fontsize=14)
        else:
            ax.annotate(f"{label} {value:.1f} s", (left + value / 2, 0.28), xytext=(left + value / 2 + 0.5, 0.6),
                        fontsize=13, arrowprops=dict(arrowstyle="-", color="#555555"))
        left += value
    ax.set_yticks([0, 1], ["4 × V100\noptimizer on CPU", "8 × V100\nno offload"])
    ax.set(xlabel=f"seconds per step (the lesson's cost model; CPU AdamW at {recorded / 1e6:,.0f} M parameters/s)",
           xlim=(0, left * 1.08), ylim=(-0.5, 1.6))
    ax.grid(axis="y", visible=False)
    return fig


def fig_prefetch():
    """The lesson's prefetch scenario (Llama-3.1-8B blocks as FSDP units) on its two links, prefetch 0 and 1."""
    links = list(dict.fromkeys(call["link"] for call in calls))
    fig, axes = figure(nrows=2, ncols=2, figsize=(12.5, 6.0), sharex="col")
    for call in calls:
        ax = axes[call["prefetch"]][links.index(call["link"])]
        g, c_ = call["gather_ms"][0], call["compute_ms"][0]
        ax.broken_barh([(s, g) for s in call["gather_start"]], (1, 0.8), facecolor=COLORS["grads"],
                       edgecolor="white")
        ax.broken_barh([(s, c_) for s in call["compute_start"]], (0, 0.8), facecolor=COLORS["params"],
                       edgecolor="white")
        ax.set_yticks([0.4, 1.4], ["compute", "gather"])
        ax.set_title(f"{call['link']}, prefetch {call['prefetch']}\n{call['total_ms']:.0f} ms, "
                     f"{call['exposed_ms']:.0f} ms exposed, {call['peak_bytes'] / 2**30:.2f} GiB gathered at most",
                     fontsize=14)
        ax.grid(axis="y", visible=False)
    for ax in axes[1]:
        ax.set_xlabel("ms")
    fig.tight_layout()
    return fig
