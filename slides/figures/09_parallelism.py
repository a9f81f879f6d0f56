"""Lesson 09's deck: tensor, sequence, context and pipeline parallelism with the lesson's reference code
(shard_block, tp_block, tp_activation_bytes, ring_attention, pipeline_schedule, memory_per_gpu, plan_parallelism),
memfit.parallel's costs (stage_params, comm_bytes_per_gpu, layout_cost), the course's Comm on simulated ranks
(what TP and SP send, where K and V travel around the ring) and meter (what a rank keeps, ring attention's peak),
measured here when the deck is built, and the lesson's own demo cells for Llama 3 405B's layouts and the planner's
table (run from the solution notebook, so their settings are the lesson's)."""
from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path

import matplotlib.patches as patches
import torch

from autograder.checks import parallelism as checks
from memfit.from_lessons.activations import activation_bytes
from memfit.gpt import COURSE_CONFIGS, LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B, GPTConfig, n_params_of_config
from memfit.parallel import (ACHIEVED_FLOPS, NETWORK_BYTES_PER_S, NVLINK_BYTES_PER_S,  # noqa: F401 (the deck)
                             block_params, comm_bytes_per_gpu, cp_positions, full_block, kept_by_tp_block, layout_cost,
                             ring_peaks, rope_sbh, stage_params)
from memfit.zero import simulate
from slides.figures import (COLORS, canvas, figure, gb, gib, lesson, limit, markdown_table, measured_on,  # noqa: F401
                            mib, stacked)

LESSON = "09_parallelism"
NOTEBOOK = Path(__file__).resolve().parents[2] / "solutions" / f"{LESSON}.ipynb"
ref = lesson(LESSON)
RANK_COLORS = [COLORS["params"], COLORS["grads"], COLORS["optimizer"], COLORS["activations"], COLORS["ours"],
               COLORS["peer"], "#DA8BC3", "#CCB974"]
L8, L70, L405 = LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B


@contextlib.contextmanager
def _one_thread():
    """Simulated ranks are threads of this process: one intra-op thread each keeps a shared CPU from thrashing."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def short(cfg) -> str:
    """Llama-3.1-405B -> 405B."""
    return cfg.name.split("-")[-1]


def layout_name(p: dict, states: bool = True) -> str:
    """A layout as the slides write it: TP 8 CP 1 PP 16 DP 64 (ZeRO-1, recompute full)."""
    text = f"TP {p['tp']} CP {p['cp']} PP {p['pp']} DP {p['dp']}"
    return text + (f", ZeRO-{p['zero']}, rec. {p['recompute']}" if states else "")


# ------------------------------------------------------------------------------ the lesson's notebook itself

def _cell(cells: list[dict], marker: str) -> str:
    found = ["".join(c["source"]) for c in cells if c["cell_type"] == "code" and marker in "".join(c["source"])]
    if len(found) != 1:
        raise RuntimeError(f"{NOTEBOOK.name}: expected one code cell containing {marker!r}, found {len(found)}")
    return found[0]


def _demos() -> dict:
    """Run the lesson's demo cells for Llama 3 405B's layouts (section 7) and the planner's table (section 8) in one
    namespace that starts from the graded code, as the notebook runs them, minus the printing. memory_per_gpu and
    plan_parallelism are wrapped so that every call the cells make is kept with its arguments and result."""
    ns = dict(vars(ref))
    calls = {"memory": [], "plan": []}
    memory, plan = ns["memory_per_gpu"], ns["plan_parallelism"]

    def memory_recorded(*args):
        out = memory(*args)
        calls["memory"].append((args, out))
        return out

    def plan_recorded(*args, **kwargs):
        out = plan(*args, **kwargs)
        calls["plan"].append((args, out))
        return out

    ns.update(memory_per_gpu=memory_recorded, plan_parallelism=plan_recorded)
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for marker, key in (("LLAMA3_405B_LAYOUTS = [", "layouts"), ("for tp, pp in ((8, 16)", "smaller"),
                            ("plan = plan_parallelism(cfg, seq_len", "planner")):
            before = len(calls["memory"])
            exec(compile(_cell(cells, marker), f"{NOTEBOOK.name}: demo cell with {marker!r}", "exec"), ns)
            ns[f"{key}_calls"] = calls["memory"][before:]
    ns["plan_calls"] = calls["plan"]
    return ns


ns = _demos()
GPU = ns["GPU"]  # the lesson's card: an H100 of 80 GB
LAYOUTS = ns["LLAMA3_405B_LAYOUTS"]  # (GPUs, seq_len, tp, cp, pp, dp): Dubey et al., 2024, Table 4

# ------------------------------------------------------------------ why one GPU is not enough (section 0)

params_of = {cfg.name: n_params_of_config(cfg) for cfg in (L8, L70, L405)}


def _states(cfg) -> int:
    """Bytes of bf16 weights + gradients + AdamW (fp32 master, m, v) on one GPU: memory_per_gpu with one of each."""
    m = ref.memory_per_gpu(cfg, 8192, 1, 1, 1, 1, 1, 1, 0, "full")
    return m["params"] + m["grads"] + m["optimizer"]


SHORT, LONG = sorted({seq for _, seq, *_ in LAYOUTS})  # Llama 3's two lengths: 8K and 128K tokens
SHORT_K, LONG_K = f"{SHORT // 1024}K", f"{LONG // 1024}K"
why_rows = []
for cfg in (L8, L70, L405):
    n = params_of[cfg.name]
    act_short, act_long = (activation_bytes(cfg, 1, s, "amp", "none") for s in (SHORT, LONG))
    why_rows.append([cfg.name, f"{n / 1e9:,.1f} B", gb(2 * n, 0), gb(_states(cfg), 0), cfg.n_layers,
                     gb(act_short, 1), gb(act_long, 1), gb(cfg.n_layers * act_long, 0)])
why_table = markdown_table(["model", "parameters", "bf16 weights", "+ grads + AdamW", "layers",
                            f"one {SHORT_K} sequence, per layer", f"{LONG_K}, per layer", f"{LONG_K}, all layers"],
                           why_rows)
w70, w405 = 2 * params_of[L70.name], 2 * params_of[L405.name]
act8b_long = activation_bytes(L8, 1, LONG, "amp", "none")

# ------------------------------------------------------------------ TP and SP on simulated ranks: what each sends

TINY = COURSE_CONFIGS["tiny"]
SIM_TP, SIM_SEQ, SIM_BATCH = 2, 32, 2  # the lesson's gloo demo: course-tiny, tp 2, 32 tokens x 2


def _sent_by_block(sp: bool) -> dict:
    """The lesson's tp_block forward and backward on SIM_TP simulated ranks: the collectives rank 0 called, and the
    largest differences of the output and of x's gradient from the unsharded block (memfit.parallel.full_block)."""
    params = block_params(TINY, seed=1)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(SIM_SEQ, SIM_BATCH, TINY.d_model, generator=g)
    dy = torch.randn(SIM_SEQ, SIM_BATCH, TINY.d_model, generator=g)
    rope = rope_sbh(TINY, SIM_SEQ)

    def rows(r: int) -> slice:
        return slice(r * SIM_SEQ // SIM_TP, (r + 1) * SIM_SEQ // SIM_TP) if sp else slice(None)

    def rank(comm):
        shard = {k: v.requires_grad_() for k, v in ref.shard_block(params, TINY, SIM_TP, comm.rank).items()}
        mine = x[rows(comm.rank)].clone().requires_grad_()
        out = ref.tp_block(mine, shard, TINY, comm, rope, sp)
        forward = list(comm.calls)
        out.backward(dy[rows(comm.rank)])
        return forward, comm.calls[len(forward):], out.detach(), mine.grad
    with _one_thread():
        ranks = simulate(SIM_TP, rank)
    whole = x.clone().requires_grad_()
    want = full_block(whole, {k: v.clone().requires_grad_() for k, v in params.items()}, TINY, rope)
    want.backward(dy)
    out, dx = (torch.cat([r[i] for r in ranks]) if sp else ranks[0][i] for i in (2, 3))
    forward, backward = ranks[0][:2]
    return {"forward": forward, "backward": backward, "total": sum(b for _, b in forward + backward),
            "output_error": float((out - want.detach()).abs().max()),
            "grad_error": float((dx - whole.grad).abs().max())}


sent_tp, sent_sp = _sent_by_block(False), _sent_by_block(True)
stream_bytes = SIM_SEQ * SIM_BATCH * TINY.d_model * 4  # the residual stream, fp32


def calls_text(calls: list) -> str:
    """[("all_gather", 8192), ...] -> all-gather 8,192 B, ..."""
    return ", ".join(f"{kind.replace('_', '-')} {b:,} B" for kind, b in calls)


# ------------------------------------------------------------------ sharding the fused matrices (exercise 2)

DEMO = GPTConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=8, n_kv_heads=2, ffn_hidden=8, max_seq_len=64,
                 name="demo")
DEMO_TP = 2


def _row_names(cfg) -> dict[str, list[str]]:
    """The name of each row of wqkv (the head it belongs to) and of w13 (gate or up, and the unit)."""
    d = cfg.head_dim
    qkv = [f"q{i // d}" for i in range(cfg.q_dim)] + [f"k{i // d}" for i in range(cfg.kv_dim)] + \
        [f"v{i // d}" for i in range(cfg.kv_dim)]
    w13 = [f"g{i}" for i in range(cfg.ffn_hidden)] + [f"u{i}" for i in range(cfg.ffn_hidden)]
    return {"wqkv": qkv, "w13": w13}


def _who_holds() -> dict:
    """Which rank's shard_block holds each row of wqkv and w13: the rows are numbered, then sharded."""
    params = block_params(DEMO)
    for name in ("wqkv", "w13"):
        rows = params[name].shape[0]
        params[name] = torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, DEMO.d_model).contiguous()
    names = _row_names(DEMO)
    held = {"wqkv": {}, "w13": {}}
    order = {}
    for r in range(DEMO_TP):
        shard = ref.shard_block(params, DEMO, DEMO_TP, r)
        for name in held:
            rows = [int(i) for i in shard[name][:, 0].tolist()]
            for i in rows:
                held[name][names[name][i]] = r
            order[(name, r)] = list(dict.fromkeys(names[name][i] for i in rows))
    naive = {}  # a contiguous cut of the fused matrix: what shard_block must not do
    for r, part in enumerate(torch.arange(len(names["wqkv"])).chunk(DEMO_TP)):
        for i in part.tolist():
            naive.setdefault(names["wqkv"][i], r)
    return {"held": held, "order": order, "naive": naive, "names": names}


split = _who_holds()
group = DEMO.n_heads // DEMO.n_kv_heads
rank0_qkv = " ".join(split["order"][("wqkv", 0)])

MEDIUM = COURSE_CONFIGS["medium"]
_medium = block_params(MEDIUM, seed=0, dtype=torch.bfloat16)
medium_held = {tp: sum(t.untyped_storage().nbytes() for t in ref.shard_block(_medium, MEDIUM, tp, 0).values())
               for tp in (1, 2, 4)}
del _medium
STAGES405 = LAYOUTS[0][4]  # Llama 3's pipeline depth
stage405 = {tp: 2 * stage_params(L405, tp, STAGES405) for tp in (1, LAYOUTS[0][2])}  # bf16 weights of the first stage

# ------------------------------------------------------------------ what a rank keeps (exercise 4)

SMALL = COURSE_CONFIGS["small"]
KEPT_SEQ, KEPT_BATCH = 256, 2  # the lesson's demo: course-small, 256 tokens x 2, fp32
with _one_thread():
    kept_rows = [(tp, sp, kept_by_tp_block(ref.tp_block, ref.shard_block, SMALL, tp, KEPT_SEQ, KEPT_BATCH, sp),
                  ref.tp_activation_bytes(SMALL, KEPT_SEQ, KEPT_BATCH, tp, sp, dtype_bytes=4))
                 for tp in (1, 2, 4) for sp in (False, True)]
kept_table = markdown_table(["t", "SP", "measured (meter)", "tp_activation_bytes"],
                            [[tp, "yes" if sp else "no", mib(m, 2), mib(p, 2)] for tp, sp, m, p in kept_rows])
kept_exact = all(m == p for *_, m, p in kept_rows)

ACT_SEQ, TPS = 8192, [1, 2, 4, 8]  # the lesson's chart: Llama-3.1-70B, one 8K sequence, bf16
act70 = {(sp, rec): [ref.tp_activation_bytes(L70, ACT_SEQ, 1, t, sp, rec) for t in TPS]
         for sp, rec in ((False, "none"), (True, "none"), (True, "full"))}
act_tp8, act_sp8, act_full8 = (act70[k][-1] for k in ((False, "none"), (True, "none"), (True, "full")))

# ------------------------------------------------------------------ context parallelism (exercise 5)

ZZ_CP = 4
ZZ_SEQ = 2 * ZZ_CP * 16  # 16 tokens a chunk: enough for the causal triangle to count as half a chunk


def _work(positions) -> int:
    """Query-key pairs a causal attention computes for these query positions: position p sees p + 1 keys."""
    return int((positions + 1).sum())


zz_work = [_work(cp_positions(ZZ_SEQ, ZZ_CP, r)) for r in range(ZZ_CP)]
contiguous_work = [_work(torch.arange(r * ZZ_SEQ // ZZ_CP, (r + 1) * ZZ_SEQ // ZZ_CP)) for r in range(ZZ_CP)]
zz_chunks = {r: [int(p) // (ZZ_SEQ // (2 * ZZ_CP)) for p in cp_positions(ZZ_SEQ, ZZ_CP, r)[::ZZ_SEQ // (2 * ZZ_CP)]]
             for r in range(ZZ_CP)}


def _ring_trace(cp: int = ZZ_CP, chunk: int = 4, heads: int = 2, d: int = 8) -> dict:
    """The lesson's ring_attention on cp simulated ranks in bf16, each rank's K a constant (its rank): which rank's
    K and V each rank holds at each step, and every ring_pass it makes, forward and backward, with its bytes."""
    def rank(comm):
        phase = ["forward"]
        log, holds = [], []
        real = comm.ring_pass

        def ring_pass(t):
            got = real(t)
            if t.dtype == torch.bfloat16:  # K and V stacked: the owner is the value of K
                if phase[0] == "forward":
                    if not holds:
                        holds.append(int(t[0].flatten()[0]))
                    holds.append(int(got[0].flatten()[0]))
                log.append((phase[0], "K, V", t.nbytes))
            else:
                log.append((phase[0], "dK, dV", t.nbytes))
            return got
        comm.ring_pass = ring_pass
        g = torch.Generator().manual_seed(comm.rank)
        shape = (2 * chunk, 1, heads, d)
        q = torch.randn(shape, generator=g).to(torch.bfloat16).requires_grad_()
        k = torch.full(shape, float(comm.rank), dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(shape, generator=g).to(torch.bfloat16).requires_grad_()
        out = ref.ring_attention(q, k, v, comm)
        phase[0] = "backward"
        out.backward(torch.ones_like(out))
        return {"holds": holds if holds else [comm.rank], "log": log, "kv_bytes": 2 * k.nbytes}
    with _one_thread():
        return simulate(cp, rank)


ring = _ring_trace()
ring_log = ring[0]["log"]
kv_bytes = ring[0]["kv_bytes"]
ring_count = {(ph, what): sum(1 for p, w, _ in ring_log if (p, w) == (ph, what))
              for ph in ("forward", "backward") for what in ("K, V", "dK, dV")}
ring_sent = {ph: sum(b for p, _, b in ring_log if p == ph) for ph in ("forward", "backward")}
dkv_ratio = next(b for _, w, b in ring_log if w == "dK, dV") // kv_bytes

RING_N, RING_HEADS, RING_D = 2048, 4, 32  # the lesson's demo: N = 2,048 tokens, 4 heads of 32, fp32
with _one_thread():
    ring_peak = {cp: max(ring_peaks(ref.ring_attention, cp, RING_N, 1, RING_HEADS, RING_D)) for cp in (1, 2, 4, 8)}
ring_q = {cp: RING_N // cp * RING_HEADS * RING_D * 4 for cp in ring_peak}
# the check's memory budget for a rank's q of that shape (fp32 tensors the size of q, and a few query tiles of scores)
ring_budget = {cp: checks._ring_budget(torch.empty(RING_N // cp, 1, RING_HEADS, RING_D)) for cp in ring_peak}
ring_line = ", ".join(f"cp {cp}: {mib(p, 2)}" for cp, p in ring_peak.items())
ring_ratio = {cp: p / ring_q[cp] for cp, p in ring_peak.items()}
ring_within = all(ring_peak[cp] <= ring_budget[cp] for cp in ring_peak)

# ------------------------------------------------------------------ pipeline schedules (exercise 6)

PIPE_STAGES, PIPE_MICRO = 4, 8  # the lesson's chart
pipes = {s: ref.pipeline_schedule(PIPE_STAGES, PIPE_MICRO, s) for s in ref.SCHEDULES}
pp405 = LAYOUTS[0][4]
bubble405 = {m: ref.pipeline_schedule(pp405, m, "1f1b")["bubble_fraction"] for m in (pp405, 2 * pp405, 8 * pp405)}

# ------------------------------------------------------------------ memory per GPU: Llama 3 405B (exercise 7)

layout_rows = {}  # (gpus, seq) -> {(zero, recompute): memory}
for args, out in ns["layouts_calls"]:
    cfg, seq, mb, n_micro, tp, pp, cp, dp, zero, rec = args
    layout_rows.setdefault((tp * cp * pp * dp, seq, tp, cp, pp, dp, n_micro), {})[(zero, rec)] = out
if len(layout_rows) != len(LAYOUTS):
    raise RuntimeError("the lesson's layouts cell no longer evaluates each of Llama 3's layouts")


def _fits(total: int) -> str:
    return gb(total) if total <= GPU else f"**{gb(total)}**"


llama3_table = markdown_table(
    ["GPUs", "tokens", "TP CP PP DP", "micro-batches", "ZeRO-1, none", "ZeRO-1, full", "ZeRO-2, full", "ZeRO-3, full"],
    [[f"{g:,}", f"{s // 1024}K", f"{tp} {cp} {pp} {dp}", m, *(_fits(mem[k]["total"]) for k in
                                                              ((1, "none"), (1, "full"), (2, "full"), (3, "full")))]
     for (g, s, tp, cp, pp, dp, m), mem in layout_rows.items()])
first = next(iter(layout_rows.values()))
z1_full, z1_none = first[(1, "full")], first[(1, "none")]
per_stage = -(-L405.n_layers // LAYOUTS[0][4])
tokens_per_step = {seq: n_micro * dp * seq for (_, seq, _, _, _, dp, n_micro) in layout_rows}
step_tokens = f"{tokens_per_step[LAYOUTS[0][1]] / 2**20:.0f}M"
cp_local = {seq: seq // cp for (_, seq, _, cp, _, _, _) in layout_rows}
zero_ranks = {f"{g:,} GPUs, {s // 1024}K": dp * cp for g, s, tp, cp, pp, dp in LAYOUTS}  # ZeRO shards over dp·cp
in_flight405 = min(LAYOUTS[0][4], next(iter(layout_rows))[-1])  # the first stage of the first layout
layouts_text = "; ".join(f"{g:,} GPUs TP {tp} CP {cp} PP {pp} DP {dp} at {s // 1024}K"
                         for g, s, tp, cp, pp, dp in LAYOUTS)
bytes_per_param = _states(L405) / params_of[L405.name]

smaller = []
for args, out in ns["smaller_calls"]:
    cfg, seq, mb, n_micro, tp, pp, cp, dp, zero, rec = args
    states = out["params"] + out["grads"] + out["optimizer"]
    smaller.append([f"TP {tp} PP {pp} DP {dp}", gb(states), gb(out["activations"]), _fits(out["total"]),
                    "yes" if out["total"] <= GPU else "no"])
smaller_args = ns["smaller_calls"][0][0]
_, _s, _mb, _m, _tp, _pp, _cp, _dp, _z, _rec = smaller_args
smaller_title = (f"{L405.name}, {_s // 1024}K tokens, {_tp * _pp * _cp * _dp:,} GPUs, micro-batch {_mb}, ZeRO-{_z}, "
                 f"recompute {_rec}")
smaller_table = markdown_table(["layout", "states", "activations", "total", "fits"], smaller)

# ------------------------------------------------------------------ the planner (exercise 8)

planned = {}  # (model, seq, gpus) -> plan or None, from the lesson's table cell
for (cfg, seq, batch, gpus, card), plan in ns["plan_calls"]:
    planned[(cfg.name, seq, gpus)] = (plan, batch)
PLAN_GPUS = list(dict.fromkeys(g for (_, _, g) in planned))
PLAN_SEQS = list(dict.fromkeys(s for (_, s, _) in planned))


def _plan_cell(cfg, seq, gpus) -> str:
    plan, _ = planned[(cfg.name, seq, gpus)]
    if plan is None:
        return "nothing fits"
    rec = " rec" if plan["recompute"] == "full" else ""
    return f"{plan['tp']}·{plan['cp']}·{plan['pp']}·{plan['dp']} Z{plan['zero']}{rec}"


plan_table = markdown_table(["model", "tokens"] + [f"{g:,} GPUs" for g in PLAN_GPUS],
                            [[short(cfg), f"{seq // 1024}K"] + [_plan_cell(cfg, seq, g) for g in PLAN_GPUS]
                             for cfg in (L8, L70, L405) for seq in PLAN_SEQS])


big_plan = planned[(L405.name, SHORT, PLAN_GPUS[-1])][0]
smallest_405 = max(g for (name, _, g), (p, _) in planned.items() if name == L405.name and p is None)


def _args(cfg, seq, p) -> tuple:
    return (cfg, seq, p["micro_batch"], p["n_micro"], p["tp"], p["pp"], p["cp"], p["dp"], p["zero"], p["recompute"])


def _paper_best(gpus, seq, tp, cp, pp, dp) -> dict:
    """Llama 3's (tp, cp, pp, dp) with the ZeRO stage and recomputation that fit and lose the least time."""
    batch = ns["plan_calls"][0][0][2] * ns["plan_calls"][0][0][1] // seq  # the lesson's 16M tokens a step
    best = None
    for zero in range(4):
        for rec in ref.RECOMPUTE:
            p = dict(tp=tp, cp=cp, pp=pp, dp=dp, zero=zero, recompute=rec, micro_batch=1, n_micro=batch // dp)
            if ref.memory_per_gpu(*_args(L405, seq, p))["total"] > GPU:
                continue
            cost = layout_cost(*_args(L405, seq, p))
            if best is None or cost["overhead_s"] < best[1]["overhead_s"]:
                best = (p, cost)
    return best


versus = []  # (label, paper's layout, its cost, the planner's layout, its cost)
for gpus, seq, tp, cp, pp, dp in LAYOUTS:
    paper, paper_cost = _paper_best(gpus, seq, tp, cp, pp, dp)
    key = (L405.name, seq, gpus)
    mine = planned[key][0] if key in planned else ref.plan_parallelism(L405, seq, paper["n_micro"] * dp, gpus, GPU)
    versus.append((f"{gpus:,} GPUs, {seq // 1024}K", paper, paper_cost, mine, layout_cost(*_args(L405, seq, mine))))
v8k = versus[1]
big_plan_memory = ref.memory_per_gpu(*_args(L405, SHORT, big_plan))["total"]
big_plan_cost = layout_cost(*_args(L405, SHORT, big_plan))["overhead_s"]
paper_bubble = v8k[2]["bubble_s"] / v8k[2]["overhead_s"]
comm405 = comm_bytes_per_gpu(*_args(L405, LAYOUTS[2][1], versus[2][1]))

# ------------------------------------------------------------------ grading

points = {c.name: c.points for c in checks.CHECKS}
_plans = {name: make() for name, make in checks.PLANS.items()}
drawn = {"conjugate_ops": checks.DRAWN_CONJUGATE_CASES, "shard_block": checks.DRAWN_SHARD_CASES,
         "tp_block": checks.DRAWN_BLOCK_CASES, "tp_activation_bytes": checks.DRAWN_ACTIVATION_CASES,
         "ring_attention": checks.DRAWN_RING_CASES, "pipeline_schedule": checks.DRAWN_SCHEDULE_CASES,
         "memory_per_gpu": checks.DRAWN_MEMORY_CASES, "plan_parallelism": checks.DRAWN_PLAN_CASES}
what = {"conjugate_ops": "forward and x's gradient exact against rank sums; one collective each way (Comm's log); "
                         "one rank to several, every float dtype, views; `ValueError`",
        "shard_block": "each tensor, its own memory, contiguous; GQA, MHA, one kv head, head_dim override; "
                       "`ValueError`",
        "tp_block": "output, dx and every shard's gradient against `full_block` in fp64, TP and SP; the collectives",
        "tp_activation_bytes": "the reference block measured by the meter (exact); Llama shapes by the table; "
                               "`ValueError`",
        "ring_attention": "out, dq, dk, dv against full causal attention; `ring_pass` only; peak within the budget",
        "pipeline_schedule": "every op's start and end, total, bubble, in flight; `ValueError`",
        "memory_per_gpu": "each category to the byte: Llama 3's layouts, small tied and untied models; `ValueError`",
        "plan_parallelism": "a legal layout that fits and loses no more than the best (ties allowed); `None`"}
grade_table = markdown_table(
    ["ex.", "check", "pts", "cases: visible + hidden + drawn", "what it compares"],
    [[i, f"`{c.name}`", f"{c.points:g}", f"{sum(not k.hidden for k in _plans[c.name])} + "
      f"{sum(k.hidden for k in _plans[c.name])} + {drawn[c.name]}", what[c.name]]
     for i, c in enumerate(checks.CHECKS, start=1)])
where = measured_on()


# ------------------------------------------------------------------------------------------------- figures

def _box(ax, x, y, w, h, text, face, ink="white", fontsize=14, **kwargs):
    ax.add_patch(patches.FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.0,rounding_size=0.08", facecolor=face,
                                        edgecolor="none", **kwargs))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=ink)


def fig_block_flow():
    """The attention half of the block on one rank of t, with TP's f and g and SP's gather and scatter (the MLP half
    is the same with w13 and w2)."""
    fig, ax = canvas(figsize=(13.5, 4.6))
    steps = [("RMSNorm", "c"), ("f", "op"), ("wqkv\ncolumns", "c"), ("attention\nheads / t", "c"),
             ("wo\nrows", "c"), ("g", "op"), ("+ x", "c")]
    rows = [("TP", "identity\nall-reduce", "all-reduce\nidentity", "x: all s tokens\non every rank"),
            ("TP + SP", "all-gather\nreduce-scatter", "reduce-scatter\nall-gather", "x: s / t tokens\non rank r")]
    w, gap, h = 1.45, 0.32, 0.8
    left = 2.3
    for k, (label, f_text, g_text, x_text) in enumerate(rows):
        y = -k * 2.15
        ax.text(0.0, y + h / 2 + 0.18, label, ha="left", va="center", fontsize=17, weight="bold")
        ax.text(0.0, y + h / 2 - 0.35, x_text, ha="left", va="center", fontsize=12.5, color="#555555")
        for i, (text, kind) in enumerate(steps):
            x = left + i * (w + gap)
            face = COLORS["grads"] if kind == "op" else "#b9c4d6"
            ink = "white" if kind == "op" else "#1f2d3d"
            _box(ax, x, y, w, h, text, face, ink, fontsize=14 if kind == "op" else 13)
            if i:
                ax.annotate("", xy=(x, y + h / 2), xytext=(x - gap, y + h / 2),
                            arrowprops=dict(arrowstyle="-|>", lw=1.5, color="#555555"))
            if kind == "op":
                ax.text(x + w / 2, y - 0.12, f_text if text == "f" else g_text, ha="center", va="top", fontsize=12,
                        color=COLORS["grads"])
        x0, x1 = left + 2 * (w + gap) - 0.08, left + 5 * (w + gap) - gap + 0.08
        ax.add_patch(patches.Rectangle((x0, y - 0.1), x1 - x0, h + 0.2, fill=False, ls="--", lw=1.3,
                                       edgecolor=COLORS["params"]))
        ax.text((x0 + x1) / 2, y + h + 0.2, "rank r: its heads, every token", ha="center", va="bottom", fontsize=12.5,
                color=COLORS["params"])
    ax.text(left, -3.85, "under f and g: forward (top), backward (below)", fontsize=12.5, color="#555555")
    ax.set(xlim=(-0.1, left + 7 * (w + gap)), ylim=(-4.05, 1.35))
    return fig


def fig_fused_split():
    """wqkv and w13 of a small GQA block (8 query heads, 2 kv heads) on 2 ranks: which rank holds each head's rows
    under shard_block, against a contiguous cut of the fused matrix."""
    fig, ax = canvas(figsize=(13, 4.2))
    heads = list(dict.fromkeys(split["names"]["wqkv"]))
    units = list(dict.fromkeys(split["names"]["w13"]))
    strips = [("wqkv, shard_block", heads, split["held"]["wqkv"], 1.0),
              ("wqkv, cut in 2 halves", heads, split["naive"], 1.0),
              ("w13 (gate | up), shard_block", units, split["held"]["w13"], len(heads) / len(units))]
    for k, (label, cells, owner, width) in enumerate(strips):
        y = -k * 1.35
        ax.text(-0.25, y + 0.4, label, ha="right", va="center", fontsize=14)
        for i, name in enumerate(cells):
            color = RANK_COLORS[owner[name]]
            ax.add_patch(patches.Rectangle((i * width, y), width * 0.94, 0.8, facecolor=color, edgecolor="none",
                                           alpha=0.9))
            ax.text(i * width + width * 0.47, y + 0.4, name, ha="center", va="center", fontsize=13, color="white")
    for r in range(DEMO_TP):
        ax.add_patch(patches.Rectangle((r * 3.2, 1.05), 0.4, 0.35, facecolor=RANK_COLORS[r], edgecolor="none"))
        ax.text(r * 3.2 + 0.55, 1.22, f"rank {r}", va="center", fontsize=14)
    ax.text(len(heads) + 0.2, 0.4, f"rank 0: {rank0_qkv}", va="center", fontsize=13, color="#555555")
    ax.text(len(heads) + 0.2, -1.35 + 0.4, "rank 0: no k, no v", va="center", fontsize=13,
            color=COLORS["activations"])
    ax.set(xlim=(-6.2, len(heads) + 5.2), ylim=(-2.85, 1.55))
    return fig


def fig_activations_tp():
    """The lesson's chart: what one rank keeps per layer of Llama-3.1-70B for one 8K sequence, against t."""
    fig, ax = figure(figsize=(7.4, 4.9))
    styles = {(False, "none"): ("o-", COLORS["activations"], "TP"),
              (True, "none"): ("s-", COLORS["params"], "TP + SP"),
              (True, "full"): ("^-", COLORS["optimizer"], "TP + SP, full recomputation")}
    for key, values in act70.items():
        marker, color, label = styles[key]
        ax.plot(TPS, [v / 2**30 for v in values], marker, color=color, lw=2.2, ms=8, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(TPS, [str(t) for t in TPS])
    ax.set(xlabel="tensor-parallel ranks t", ylabel="GiB per layer per rank")
    ax.set_title(f"{L70.name}, one {ACT_SEQ // 1024}K sequence, bf16", fontsize=15)
    ax.legend(frameon=False, fontsize=13)
    return fig


def fig_zigzag():
    """Causal attention's chunk pairs under ZZ_CP-way context parallelism, coloured by the rank whose queries they are
    (rank r holds chunks r and 2·cp−1−r), and the work per rank, contiguous against zigzag."""
    fig, (ax, bx) = figure(ncols=2, figsize=(12.5, 4.1), gridspec_kw={"width_ratios": [1, 1.25]})
    n = 2 * ZZ_CP
    owner = {c: r for r, chunks in zz_chunks.items() for c in chunks}
    for qc in range(n):
        for kc in range(qc + 1):
            color = RANK_COLORS[owner[qc]]
            if kc < qc:
                ax.add_patch(patches.Rectangle((kc, qc), 0.94, 0.94, facecolor=color, edgecolor="none"))
            else:
                ax.add_patch(patches.Polygon([(kc, qc), (kc, qc + 0.94), (kc + 0.94, qc + 0.94)], facecolor=color,
                                             edgecolor="none"))
    ax.set(xlim=(0, n), ylim=(n, 0), xlabel="key chunk", ylabel="query chunk", aspect="equal")
    ax.set_xticks([i + 0.47 for i in range(n)], range(n))
    ax.set_yticks([i + 0.47 for i in range(n)], [f"{i} → r{owner[i]}" for i in range(n)], fontsize=12)
    ax.grid(False)
    ax.set_title(f"cp = {ZZ_CP}: {2 * ZZ_CP} chunks, zigzag", fontsize=15)
    x = list(range(ZZ_CP))
    wdt = 0.38
    bx.bar([i - wdt / 2 for i in x], [w / 1e3 for w in contiguous_work], wdt, color=COLORS["neutral"],
           label="contiguous quarters")
    bx.bar([i + wdt / 2 for i in x], [w / 1e3 for w in zz_work], wdt, color=[RANK_COLORS[r] for r in x],
           label="zigzag (cp_positions)")
    bx.set_xticks(x, [f"rank {r}" for r in x])
    bx.set(ylabel="query-key pairs (thousands)")
    bx.set_title(f"causal work per rank, {ZZ_SEQ} tokens", fontsize=15)
    bx.legend(frameon=False, loc="upper left", fontsize=13)
    bx.grid(axis="x", visible=False)
    fig.tight_layout()
    return fig


def fig_ring():
    """Which rank's K and V each rank holds at each step of ring attention (traced from the lesson's code on
    simulated ranks), and where the dK, dV accumulators that travel with them end up."""
    cp = len(ring)
    steps = len(ring[0]["holds"])
    home = ring_count[("backward", "dK, dV")]
    fig, ax = canvas(figsize=(12.5, 3.9))
    for r, rank in enumerate(ring):
        y = -r
        ax.text(-0.2, y + 0.4, f"rank {r}", ha="right", va="center", fontsize=14)
        for s, j in enumerate(rank["holds"]):
            ax.add_patch(patches.Rectangle((s * 1.6, y), 1.5, 0.8, facecolor=RANK_COLORS[j], edgecolor="none"))
            ax.text(s * 1.6 + 0.75, y + 0.4, f"K, V of {j}", ha="center", va="center", fontsize=13, color="white")
        j = (r - home) % cp
        x = steps * 1.6 + 0.9
        ax.add_patch(patches.Rectangle((x, y), 2.1, 0.8, facecolor="white", edgecolor=RANK_COLORS[j], lw=2.5))
        ax.text(x + 1.05, y + 0.4, f"dK, dV of {j}", ha="center", va="center", fontsize=13, color=RANK_COLORS[j])
    for s in range(steps):
        ax.text(s * 1.6 + 0.75, 1.0, f"step {s}", ha="center", fontsize=14)
    ax.text(steps * 1.6 + 1.95, 1.0, f"after {home} passes", ha="center", fontsize=14)
    ax.set(xlim=(-1.4, steps * 1.6 + 3.2), ylim=(-cp + 0.6, 1.5))
    return fig


def fig_pipeline():
    """The lesson's chart: GPipe and 1F1B on PIPE_STAGES stages and PIPE_MICRO micro-batches (a backward takes twice a
    forward), from pipeline_schedule."""
    fig, axes = figure(nrows=2, figsize=(13, 5.0), sharex=True)
    for ax, (schedule, sim) in zip(axes, pipes.items()):
        for s, ops in enumerate(sim["ops"]):
            for kind, m, start, end in ops:
                ax.barh(s, end - start, left=start, color=COLORS["params"] if kind == "F" else COLORS["grads"],
                        edgecolor="white", height=0.8)
                ax.text((start + end) / 2, s, str(m), ha="center", va="center", fontsize=11, color="white")
        ax.set_yticks(range(len(sim["ops"])), [f"stage {s}" for s in range(len(sim["ops"]))], fontsize=12)
        ax.invert_yaxis()
        ax.grid(False)
        ax.set_title(f"{'GPipe' if schedule == 'gpipe' else '1F1B'}: bubble {sim['bubble_fraction']:.0%}, "
                     f"micro-batches in flight per stage {sim['in_flight']}", fontsize=14)
    axes[-1].set_xlabel("time (a forward = 1, a backward = 2); blue forward, orange backward")
    fig.tight_layout()
    return fig


def fig_llama3():
    """Memory per GPU of Llama 3 405B's three layouts (memory_per_gpu, as the lesson's cell calls it), by category,
    under ZeRO-1 without and with full recomputation and ZeRO-2, -3 with it, against the lesson's 80 GB card."""
    fig, ax = figure(figsize=(12.5, 4.9))
    shown = [(1, "none"), (1, "full"), (2, "full"), (3, "full")]
    at, labels, columns = [], [], []
    for g_i, ((gpus, seq, tp, cp, pp, dp, m), mem) in enumerate(layout_rows.items()):
        for b_i, key in enumerate(shown):
            at.append(g_i * (len(shown) + 1.2) + b_i)
            labels.append(f"Z{key[0]}\n{key[1]}")
            columns.append(mem[key])
    parts = [([c[k] / 1e9 for c in columns], COLORS[k], label) for k, label in
             (("params", "parameters"), ("grads", "gradients"), ("optimizer", "optimizer"),
              ("activations", "activations"))]
    totals = stacked(ax, at, parts, width=0.8)
    for x, t in zip(at, totals):
        ax.text(x, t + 2, f"{t:.0f}", ha="center", va="bottom", fontsize=12)
    limit(ax, GPU / 1e9, f"{GPU / 1e9:.0f} GB", (at[-1] + 0.6, GPU / 1e9 + 3), vertical=False, ha="right",
          fontsize=13)
    ax.set_xticks(at, labels, fontsize=11)
    for g_i, (gpus, seq, tp, cp, pp, dp, m) in enumerate(layout_rows):
        ax.text(g_i * (len(shown) + 1.2) + 1.5, max(totals) * 1.1, f"{gpus:,} GPUs, {seq // 1024}K\n"
                f"TP {tp} CP {cp} PP {pp} DP {dp}", ha="center", va="bottom", fontsize=13)
    ax.set(ylabel="GB per GPU", ylim=(0, max(totals) * 1.32))
    ax.legend(loc="center right", frameon=False, fontsize=12, bbox_to_anchor=(1.0, 0.55))
    ax.grid(axis="x", visible=False)
    return fig


def fig_overhead():
    """The seconds a step loses per GPU (layout_cost): Llama 3's layout (with the ZeRO stage and recomputation that
    fit and lose least) against the planner's choice, for each of the paper's three settings."""
    fig, ax = figure(figsize=(12.5, 4.9))
    bars, names = [], []
    for label, paper, paper_cost, mine, mine_cost in versus:
        bars += [paper_cost, mine_cost]
        names += [f"{label}\npaper: {layout_name(paper, False)}", f"planner: {layout_name(mine, False)}"]
    y = list(range(len(bars)))[::-1]
    parts = [([b[k] for b in bars], color, label) for k, color, label in
             (("comm_s", COLORS["params"], "communication"), ("bubble_s", COLORS["grads"], "pipeline bubble"),
              ("recompute_s", COLORS["optimizer"], "recomputation"))]
    totals = stacked(ax, y, parts, horizontal=True, height=0.7)
    for yy, t in zip(y, totals):
        ax.text(t + 0.15, yy, f"{t:.1f} s", va="center", fontsize=12)
    ax.set_yticks(y, names, fontsize=11)
    ax.set(xlabel="seconds lost per step, per GPU (layout_cost)", xlim=(0, max(totals) * 1.15))
    ax.legend(frameon=False, loc="center right", fontsize=13)
    ax.grid(axis="y", visible=False)
    fig.tight_layout()
    return fig
