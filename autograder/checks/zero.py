"""Checks of lesson 03 (solutions/03_zero.ipynb): shards, a sharded AdamW for ZeRO stages 0-3 that must train
the course GPT to the weights of unsharded AdamW, its memory and traffic per rank, the same optimizer on gloo
processes, DeepSpeed's ZeRO-3 estimator and a prefetch timeline.

References come from memfit.from_lessons.zero (extracted from the solution notebook) and from memfit.zero's
training loop and unsharded AdamW; nothing here trusts a number the learner's code reports about itself
without measuring it too.

Every check's cases are data: PLANS[check] builds a list of Case records (its arguments, whether it is hidden,
and the axes it covers); the check iterates over them and case_axes() reads the same list. AXES lists, per
check, the values the exercise's text allows (autograder/checks/axes.py).
"""
from __future__ import annotations

import functools

import math
import random
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import memfit
import memfit.from_lessons.zero as _reference  # imported before the grading child's guards go up
from autograder.checks import (Check, CheckFailed, LearnerCodeError, call_learner, check_cases, expect_value_error,
                               given_references, select)
from autograder.checks.numerics import check_guards, current_draw, dtype_name, guarded_empty, seeded_generator
from autograder.checks.domain import Choice, Impossible, Sizes, grade_drawn

TINY = "tiny"
OPT_ARGS = dict(lr=1e-2, eps=1e-3, weight_decay=0.1)  # eps large enough that forgetting to divide by N shows
# Synthetic cases: small parameters and a large eps make the update nearly linear in the gradient, so a gradient
# that differs in its last bit (divided before the sum, say) moves the parameters' last bits too.
# Their betas are not the default ones (OPT_ARGS's are), so betas passed and then ignored show from the second step.
SYN_ARGS = dict(lr=1.0, betas=(0.8, 0.95), eps=10.0, weight_decay=0.1)
REL_TOL = 1e-6  # gloo with 3+ ranks sums in another order than the reference; 2 ranks and simulated ranks: bitwise


def _ref():
    return _reference


def _micro_config():
    """A GPT of 3,152 parameters: not a multiple of 3, 5 or 7, so those world sizes pad the flat vector."""
    from memfit.gpt import GPTConfig
    return GPTConfig(vocab_size=37, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=24,
                     max_seq_len=64, name="course-micro")


def _numel_of(cfg) -> int:
    from memfit.gpt import COURSE_CONFIGS
    from memfit.zero import FlatModel
    return FlatModel.of(COURSE_CONFIGS[cfg] if isinstance(cfg, str) else cfg).numel


def _dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes graded on this machine: its profile's (fp32, fp16 on a CPU; bf16 too with bf16 tensor cores)."""
    return tuple(memfit.profile().dtypes)


def _halves() -> tuple[torch.dtype, ...]:
    return tuple(d for d in _dtypes() if d != torch.float32)


@dataclass(frozen=True)
class Case:
    """One case of a check: what it runs (kind, args), whether it is hidden, the axis values it covers."""
    kind: str
    args: tuple
    hidden: bool
    axes: dict = field(default_factory=dict, compare=False)


_select = select  # (autograder/checks/__init__.py: one planner for every check module)


def _world(numel: int, n: int) -> str:
    if n == 1:
        return "one"
    return "divides numel" if numel % n == 0 else "does not divide numel"


def _what_shard_bounds_is():
    return dict(shard_bounds=_ref().shard_bounds)


def _count(x) -> str:
    """A value for a message: whole numbers with thousands separators (1,000,003), tuples of them alike, anything
    else as repr."""
    if isinstance(x, int) and not isinstance(x, bool):
        return f"{x:,}"
    if isinstance(x, tuple):
        return "(" + ", ".join(_count(v) for v in x) + ("," if len(x) == 1 else "") + ")"
    return repr(x)


# ------------------------------------------------------------------------------------ shard_bounds

def _numel_kind(numel: int) -> str:
    if numel == 0:
        return "zero"
    if numel < 10**6:
        return "small"
    return "model-sized" if numel < 2**53 else "beyond 2**53"


def _plan_shard_bounds() -> list[Case]:
    plan = []
    for hidden, pairs in ((False, [(10, 4), (12, 4), (0, 2), (1, 1), (3, 5), (918_144, 3), (7_500_000_000, 7),
                                   (2**53 + 1, 2)]),
                          (True, [(1, 3), (7, 8), (0, 5), (5, 1), (1_000_003, 7), (918_144, 4),
                                  (8_030_261_248, 64), (2**60 + 3, 64), (2**55 + 5, 3)])):
        for numel, n in pairs:
            ws = "more ranks than elements" if 1 < n and numel < n else _world(numel, n)
            plan.append(Case("bounds", (numel, n), hidden, {"numel": _numel_kind(numel), "world_size": ws}))
    for hidden, bad in ((False, [((10, 0, 0), "world_size < 1"), ((10, 4, 4), "rank >= world_size"),
                                 ((10, 4, -1), "rank < 0"), ((-1, 4, 0), "numel < 0")]),
                        (True, [((10, -2, 0), "world_size < 1"), ((7, 3, 9), "rank >= world_size"),
                                ((7, 3, -3), "rank < 0"), ((-7, 3, 1), "numel < 0")])):
        for args, axis in bad:
            plan.append(Case("invalid", args, hidden, {"invalid argument": axis}))
    return plan


SHARD_DOMAIN = {"numel": Sizes(0, 2**62, edges=(0, 1, 2**53 - 1, 2**53 + 1)), "world_size": Sizes(1, 512, edges=(1, 2, 3))}
DRAWN_SHARD_CASES = 20


def check_shard_bounds(shard_bounds, cases: str = "visible") -> None:
    for case in _select(_plan_shard_bounds(), cases):
        if case.kind == "invalid":
            numel, n, r = case.args
            expect_value_error(shard_bounds, numel, n, r,
                               what=f"shard_bounds(numel={numel:,}, world_size={n:,}, rank={r:,})",
                               why=f"({case.axes['invalid argument']})")
            continue
        _shard_case(shard_bounds, *case.args)
    if check_cases(cases)[1]:
        grade_drawn(SHARD_DOMAIN, "shard_bounds", DRAWN_SHARD_CASES,
                    lambda c: _shard_case(shard_bounds, c["numel"], c["world_size"]))


def _shard_case(shard_bounds, numel: int, n: int) -> None:
    def call(r):
        return f"shard_bounds(numel={numel:,}, world_size={n:,}, rank={r:,})"

    bounds = [call_learner(shard_bounds, numel, n, r, what=call(r)) for r in range(n)]
    size = -(-numel // n)
    for r, b in enumerate(bounds):
        if not (isinstance(b, tuple) and len(b) == 2 and all(isinstance(x, int) for x in b)):
            raise CheckFailed(f"{call(r)} should return a tuple (start, stop) of ints, got {_count(b)}")
        if b != (r * size, (r + 1) * size):
            lengths = ", ".join(_count(stop - start) for start, stop in bounds[:8]) + (", ..." if n > 8 else "")
            raise CheckFailed(
                f"{call(r)}: expected (start, stop) = {_count((r * size, (r + 1) * size))}, got {_count(b)}. "
                f"Every shard has ceil({numel:,}/{n:,}) = {size:,} elements and they follow each other (shard "
                f"lengths you gave: {lengths}; together they must cover all {numel:,} elements)"
                + (". Above 2**53 a float cannot hold every integer: round up with integer arithmetic"
                   if numel >= 2**53 else ""))


# --------------------------------------------------------------------------------------- ZeroAdamW

def _simulate(ZeroAdamW, world_size: int, stage: int, *, steps: int = 2, param_dtype=torch.float32, cfg=TINY,
              fn=None):
    """The learner's class on simulated ranks (train_ranks, or fn(comm) when given), with the reference
    shard_bounds in place of the learner's: a bug there costs exercise 1's points only."""
    from memfit.zero import SimulationFailed, simulate, train_ranks
    what = f"ZeroAdamW, stage {stage}, {world_size} simulated ranks"
    run = fn or (lambda comm: train_ranks(ZeroAdamW, comm, stage, cfg=cfg, steps=steps, param_dtype=param_dtype,
                                          opt_args=OPT_ARGS))
    try:
        with given_references(ZeroAdamW, **_what_shard_bounds_is()):
            return simulate(world_size, run, timeout_s=60)
    except NotImplementedError:
        call_learner(ZeroAdamW, None, None, stage)  # turns the stub into its message
        raise
    except SimulationFailed as exc:
        raise CheckFailed(f"{what}: {exc}") from None
    except CheckFailed:
        raise
    except Exception as exc:
        raise LearnerCodeError(f"{what}: your code raised {type(exc).__name__}: {exc}") from None


def _stage_hint(stage: int) -> str:
    return {0: "stage 0 all-reduces the full gradient, divides by world_size, and every rank updates everything",
            1: "stage 1 reduce-scatters the full gradient buffer, divides by world_size, updates its shard, "
               "then all-gathers the parameters",
            2: "stage 2 reduce-scatters the (padded) gradient into its gradient shard, divides, updates its shard, "
               "then all-gathers the parameters",
            3: "stage 3 reduce-scatters into its gradient shard, divides, updates its parameter shard; "
               "gather_params all-gathers"}[stage]


def _seeded(numel: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = seeded_generator(seed)
    return (scale * torch.randn(numel, generator=gen)).to(memfit.DEVICE)


def _synthetic_rank(cls, comm, numel: int, stage: int, dtype: torch.dtype, steps: int) -> dict:
    """One rank driving the optimizer as train_ranks does (gather, for stage 3 gather again into `out`, step),
    on seeded gradients instead of a model's. Returns what the check compares."""
    n = comm.world_size
    padded = -(-numel // n) * n
    params = _seeded(numel, 7, scale=0.01)
    opt = cls(params.clone(), comm, stage, param_dtype=dtype, **SYN_ARGS)
    first = opt.gather_params()
    record = {"first": first.detach().clone() if isinstance(first, torch.Tensor) else first, "sent": [],
              "out": None}
    del first
    for step in range(steps):
        before = comm.sent_bytes
        full = opt.gather_params()
        if stage == 3:
            out = guarded_empty((padded,), dtype, memfit.DEVICE)
            got = opt.gather_params(out=out)
            if record["out"] is None:
                try:
                    check_guards(out, f"gather_params(out=...), stage 3, {n} ranks")
                    same = isinstance(got, torch.Tensor) and got.data_ptr() == out.data_ptr()
                    record["out"] = "ok" if same and not torch.isnan(out.float()).any() else "ignored"
                except CheckFailed as exc:
                    record["out"] = str(exc)
            del out, got
        del full
        opt.step(_seeded(numel, 1000 * step + comm.rank).to(dtype))
        record["sent"].append(comm.sent_bytes - before)
    record["final"] = opt.gather_params().detach().clone()
    return record


@functools.lru_cache(maxsize=None)  # a function, not a module-level dict (the grader fingerprints those)
def _synthetic_want(numel: int, n: int, dtype: torch.dtype, steps: int, draw: int) -> dict:
    """What every rank of every stage must hold, from unsharded AdamW on one thread: the ranks' gradients rounded to
    `dtype`, summed in rank order and divided by n in `dtype` (what the collectives do), torch.optim.AdamW
    (foreach=False) over an fp32 master copy of the whole padded vector, its result rounded to `dtype`. AdamW is
    elementwise, so a shard's update is this update's slice: the same for every stage. Computed once per case and
    draw (`draw`: the cache's key; the seeds read it from numerics); no threads, so no simulation can disturb it."""
    padded = -(-numel // n) * n
    master = torch.zeros(padded, dtype=torch.float32, device=memfit.DEVICE)
    master[:numel] = _seeded(numel, 7, scale=0.01)
    first = master.to(dtype, copy=True)
    optimizer = torch.optim.AdamW([master], **SYN_ARGS, foreach=False)
    for step in range(steps):
        grads = [F.pad(_seeded(numel, 1000 * step + rank).to(dtype), (0, padded - numel)) for rank in range(n)]
        total = grads[0].clone()
        for g in grads[1:]:
            total += g
        master.grad = total.div_(n).float()
        optimizer.step()
    return {"first": first, "final": master.detach().to(dtype, copy=True)}


def _synthetic_case(ZeroAdamW, numel: int, n: int, stage: int, dtype: torch.dtype, steps: int = 2) -> None:
    label = f"stage {stage}, {n} simulated ranks, {numel:,} parameters, param_dtype {dtype_name(dtype)}"
    want = _synthetic_want(numel, n, dtype, steps, current_draw())
    got = _simulate(ZeroAdamW, n, stage, fn=lambda comm: _synthetic_rank(ZeroAdamW, comm, numel, stage, dtype, steps))
    padded = want["first"].numel()
    for r, rec in enumerate(got):
        first = rec["first"]
        if not isinstance(first, torch.Tensor) or tuple(first.shape) != (padded,) or first.dtype != dtype:
            shown = (f"a tensor of shape {tuple(first.shape)}, {dtype_name(first.dtype)}"
                     if isinstance(first, torch.Tensor) else type(first).__name__)
            raise CheckFailed(f"{label}, rank {r}: gather_params() gave {shown}; expected the padded full vector: "
                              f"{padded:,} = {n} x ceil({numel:,}/{n}) elements in {dtype_name(dtype)}")
        if not torch.equal(first, want["first"]):
            raise CheckFailed(f"{label}, rank {r}: before any step gather_params() should be `params` in "
                              f"{dtype_name(dtype)} followed by {padded - numel:,} zeros of padding")
        if rec["out"] not in (None, "ok"):
            raise CheckFailed(f"{label}: gather_params(out=buffer) must all-gather into `buffer` and return it"
                              if rec["out"] == "ignored" else f"{label}: {rec['out']}")
        per_step = _ref().comm_bytes_per_rank(stage, numel, n, dtype.itemsize, dtype.itemsize)
        if any(s != per_step for s in rec["sent"]):
            raise CheckFailed(f"{label}, rank {r}: a step sent {rec['sent'][-1]:,} bytes through collectives; "
                              f"expected {per_step:,}: {_stage_hint(stage)}")
        final, ref_final = rec["final"], want["final"]
        if not isinstance(final, torch.Tensor) or final.shape != ref_final.shape or final.dtype != ref_final.dtype:
            raise CheckFailed(f"{label}, rank {r}: after {steps} steps gather_params() should still give the padded "
                              f"vector of {padded:,} elements in {dtype_name(dtype)}")
        if dtype == torch.float32:
            bad = final != ref_final
        else:  # a rounding to the 16-bit dtype may differ by a unit in the last place
            eps = torch.finfo(dtype).eps
            g64, w64 = final.double(), ref_final.double()
            bad = ~((g64 - w64).abs() <= 2 * eps * w64.abs().clamp_min(1e-3))
        if bad.any():
            i = int(bad.nonzero()[0])
            err = (final.double() - ref_final.double()).abs().max().item()
            if i >= numel:
                raise CheckFailed(f"{label}, rank {r}: after {steps} steps the padding (elements {numel:,} to "
                                  f"{padded - 1:,}) holds {final[i].item():.4g} at element {i:,}; it must stay 0: "
                                  "pad the gradient "
                                  "with zeros")
            rule = ("must be bitwise equal in fp32: sum, then divide by world_size; torch.optim.AdamW(foreach=False) "
                    "over your shard" if dtype == torch.float32 else
                    "allowed: 2 units in the last place; update the fp32 master shard, then copy it into the "
                    f"{dtype_name(dtype)} parameters")
            raise CheckFailed(f"{label}, rank {r}: after {steps} steps parameter {i:,} is {final[i].item():.8g}, "
                              f"unsharded AdamW gives {ref_final[i].item():.8g} (max |diff| {err:.3g}; {rule}). "
                              f"Remember: {_stage_hint(stage)}")


def _plan_zero_adamw() -> list[Case]:
    plan = []
    gpt = {False: [(2, 0), (2, 1), (2, 2), (2, 3), (3, 3)], True: [(3, 0), (3, 1), (4, 3), (5, 2)]}
    tiny = _numel_of(TINY)
    for hidden, pairs in gpt.items():
        for n, stage in pairs:
            plan.append(Case("gpt", (n, stage), hidden, {"model": "course GPT", "stage": stage,
                                                         "world_size": _world(tiny, n), "param_dtype": "float32",
                                                         "gather_params(out=)": ("None", "given") if stage == 3
                                                         else "None"}))
    dtypes = _dtypes()
    synthetic = {False: [(11, 3), (12, 4), (1, 1)], True: [(1_001, 7), (6, 3), (1, 4), (5, 1)]}
    for hidden, sizes in synthetic.items():
        for i, (numel, n) in enumerate(sizes):
            for stage in range(4):
                dtype = dtypes[(i + stage) % len(dtypes)] if n > 1 else torch.float32
                plan.append(Case("synthetic", (numel, n, stage, dtype), hidden, {
                    "model": "synthetic gradients", "stage": stage, "world_size": _world(numel, n),
                    "param_dtype": dtype_name(dtype),
                    "gather_params(out=)": ("None", "given") if stage == 3 else "None"}))
    for hidden, stages in ((False, (4, -1)), (True, (7, -2))):
        for stage in stages:
            plan.append(Case("invalid", (stage,), hidden, {"invalid stage": "above 3" if stage > 3 else "negative"}))
    return plan


# Every synthetic step the text allows: any parameter count (fewer than the ranks too), any world size, stage and
# parameter dtype, one to three steps.
SYNTHETIC_DOMAIN = {"numel": Sizes(1, 5000, edges=(1, 2, 7)), "world_size": Sizes(1, 8, edges=(1, 2, 3)),
                    "stage": Choice(0, 1, 2, 3), "param_dtype": Choice(*(dtype_name(d) for d in _dtypes())),
                    "steps": Choice(2, 1, 3)}
DRAWN_SYNTHETIC_CASES = 6


def check_zero_adamw(ZeroAdamW, cases: str = "visible") -> None:
    from memfit.zero import max_relative_error, reference_training, single_rank
    steps = 2
    comm_bytes = _ref().comm_bytes_per_rank
    wanted: dict[int, torch.Tensor] = {}
    plan = _select(_plan_zero_adamw(), cases)
    for case in sorted(plan, key=lambda c: c.kind != "invalid"):  # the quick ones first
        if case.kind == "invalid":
            stage, = case.args
            with given_references(ZeroAdamW, **_what_shard_bounds_is()):
                expect_value_error(ZeroAdamW, torch.zeros(8), single_rank(), stage,
                                   what=f"ZeroAdamW(params, comm, stage={stage})", why="(stage must be 0, 1, 2 or 3)")
    for case in plan:
        if case.kind == "synthetic":
            _synthetic_case(ZeroAdamW, *case.args)
    if check_cases(cases)[1]:
        def check_one(d: dict) -> None:
            dtype = _dtype_named(d["param_dtype"])
            if d["world_size"] == 1 and dtype != torch.float32:
                raise Impossible()  # (one rank: the fixed cases' fp32 only)
            _synthetic_case(ZeroAdamW, d["numel"], d["world_size"], d["stage"], dtype, d["steps"])
        grade_drawn(SYNTHETIC_DOMAIN, "zero_adamw", DRAWN_SYNTHETIC_CASES, check_one)
    for case in plan:
        if case.kind != "gpt":
            continue
        n, stage = case.args
        reports = _simulate(ZeroAdamW, n, stage, steps=steps)
        if n not in wanted:
            wanted[n] = reference_training(n, steps=steps, opt_args=OPT_ARGS)
        want = wanted[n]
        got = reports[0].final
        if got.shape != want.shape:
            raise CheckFailed(f"stage {stage}, {n} ranks: gather_params() gave {got.numel():,} parameters after "
                              f"slicing to the model's {want.numel():,}: return the padded full vector")
        if not torch.equal(got, want):
            err = max_relative_error(got, want)
            raise CheckFailed(
                f"stage {stage}, {n} simulated ranks: after {steps} steps the parameters differ from unsharded "
                f"AdamW by {err:.2e} (max |diff| / max |param|; simulated ranks sum in rank order, so they must be "
                f"bitwise equal). Remember: {_stage_hint(stage)}; sum, then divide by world_size; "
                "torch.optim.AdamW(foreach=False) over your shard")
        sent = reports[-1].sent_per_step
        want_sent = comm_bytes(stage, want.numel(), n, 4, 4)
        if sent != want_sent:
            kinds = ", ".join(k for k, _ in reports[-1].calls) or "none"
            raise CheckFailed(f"stage {stage}, {n} ranks: a step sent {sent:,} bytes per rank through collectives "
                              f"({kinds}); expected {want_sent:,}: {_stage_hint(stage)}")


# ----------------------------------------------------------------------------- memory of ZeroAdamW

def _memory_case(ZeroAdamW, n: int, stage: int, dtype: torch.dtype, cfg=TINY) -> None:
    numel = _numel_of(cfg)
    p = torch.empty((), dtype=dtype).element_size()
    k = 8 if dtype == torch.float32 else 12
    want = _ref().zero_bytes_per_rank(stage, numel, n, p, p, k)
    reports = _simulate(ZeroAdamW, n, stage, steps=2, param_dtype=dtype, cfg=cfg)
    model = cfg if isinstance(cfg, str) else cfg.name
    label = f"stage {stage}, {n} ranks, {model} ({numel:,} parameters), param_dtype {dtype_name(dtype)}"
    for r, rep in enumerate(reports):
        for key in ("params", "grads", "optimizer"):
            got = rep.buffers.get(key)
            if got != want[key]:
                what = {"optimizer": " (m and v in fp32" + (", plus the fp32 master copy" if k == 12 else "") + ")",
                        "params": " (in param_dtype)", "grads": " (in param_dtype)"}[key]
                pad = (f"; {n} ranks do not divide {numel:,}: full buffers are padded to {n} x ceil({numel:,}/{n})"
                       if numel % n else "")
                raise CheckFailed(f"{label}, rank {r}: buffers()[{key!r}] holds {_count(got)} bytes; expected "
                                  f"{want[key]:,}{what}: {_stage_hint(stage)}{pad}")
        held = sum(rep.buffers.values())
        if rep.at_rest != held:
            raise CheckFailed(
                f"{label}, rank {r}: after a step the rank keeps {rep.at_rest:,} bytes alive (measured by the "
                f"live-tensor meter) but buffers() lists {held:,}: "
                + (f"{rep.at_rest - held:,} bytes more than the stage allows survive the step (a full-size copy, a "
                   "stored gradient, a cached scratch?)" if rep.at_rest > held
                   else "buffers() lists tensors the rank does not hold"))


def _plan_zero_memory() -> list[Case]:
    micro = _micro_config()
    tiny, small = _numel_of(TINY), _numel_of(micro)
    halves = _halves()
    f32, h0, h1 = torch.float32, halves[0], halves[-1]
    rows = {False: [(2, 0, f32, TINY), (2, 1, h0, TINY), (3, 2, f32, micro), (3, 3, h1, micro), (3, 0, h0, micro)],
            True: [(5, 0, h1, micro), (3, 1, f32, micro), (3, 2, h0, TINY), (4, 3, f32, micro), (3, 3, h1, TINY),
                   (5, 2, h0, micro)]}
    plan = []
    for hidden, cases in rows.items():
        for n, stage, dtype, cfg in cases:
            numel = tiny if cfg == TINY else small
            plan.append(Case("memory", (n, stage, dtype, cfg), hidden, {
                "stage": stage, "param_dtype": dtype_name(dtype), "world_size": _world(numel, n),
                "model": "course-tiny" if cfg == TINY else "course-micro"}))
    return plan


def check_zero_memory(ZeroAdamW, cases: str = "visible") -> None:
    for case in _select(_plan_zero_memory(), cases):
        _memory_case(ZeroAdamW, *case.args)
    if check_cases(cases)[1]:
        grade_drawn(ZERO_MEMORY_DOMAIN, "zero_memory", DRAWN_ZERO_MEMORY_CASES,
                    lambda d: _memory_case(ZeroAdamW, d["world_size"], d["stage"], _dtype_named(d["param_dtype"]),
                                           TINY if d["model"] == "course-tiny" else _micro_config()))


def _dtype_named(name: str) -> torch.dtype:
    return next(d for d in _dtypes() if dtype_name(d) == name)


ZERO_MEMORY_DOMAIN = {"world_size": Sizes(1, 7, edges=(1, 2, 3)), "stage": Choice(0, 1, 2, 3),
                      "param_dtype": Choice(*(dtype_name(d) for d in _dtypes())),
                      "model": Choice("course-micro", "course-tiny")}
DRAWN_ZERO_MEMORY_CASES = 2


# ----------------------------------------------------------------------------- zero_bytes_per_rank

PAPER = [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)]  # Rajbhandari et al., Figure 1: Ψ = 7.5B, N = 64, K = 12
_BYTES = {(2, 2, 12): "mixed (2, 2, 12)", (4, 4, 8): "fp32 (4, 4, 8)", (2, 4, 12): "P != G (2, 4, 12)"}


def _size_kind(numel: int) -> str:
    return "one element" if numel == 1 else ("model-sized" if numel >= 10**9 else "small")


def _plan_zero_bytes() -> list[Case]:
    plan = [Case("paper", (stage, gb), False, {"stage": stage, "world_size": "divides numel", "numel": "model-sized",
                                               "bytes": "defaults", "paper": "ZeRO paper"}) for stage, gb in PAPER]
    rows = {False: [(s, numel, n, pgk) for s in range(4) for numel, n, pgk in
                    ((918_144, 3, (4, 4, 8)), (1_000_003, 4, (2, 4, 12)), (1, 1, (2, 2, 12)), (10, 4, None))],
            True: [(s, numel, n, pgk) for s in range(4) for numel in (1, 7, 8_030_261_248) for n in (1, 5, 64)
                   for pgk in ((2, 2, 12), (4, 4, 8), (2, 4, 12))]
                  + [(s, 1_000_003, 7, None) for s in range(4)]}
    for hidden, cases in rows.items():
        for stage, numel, n, pgk in cases:
            plan.append(Case("formula", (stage, numel, n, pgk), hidden, {
                "stage": stage, "world_size": _world(numel, n), "numel": _size_kind(numel),
                "bytes": _BYTES[pgk] if pgk else "defaults"}))
    plan += [Case("paper", (stage, gb), True, {"paper": "ZeRO paper"}) for stage, gb in PAPER]
    for hidden, stages in ((False, (4, -1)), (True, (5, -3))):
        plan += [Case("invalid", (s,), hidden, {"invalid stage": "above 3" if s > 3 else "negative"}) for s in stages]
    return plan


def check_zero_bytes_per_rank(zero_bytes_per_rank, cases: str = "visible") -> None:
    reference = _ref().zero_bytes_per_rank
    with given_references(zero_bytes_per_rank, **_what_shard_bounds_is()):
        for case in _select(_plan_zero_bytes(), cases):
            if case.kind == "paper":
                stage, gb = case.args
                got = call_learner(zero_bytes_per_rank, stage, 7_500_000_000, 64)
                if not isinstance(got, dict) or "total" not in got:
                    raise CheckFailed(f"zero_bytes_per_rank(stage={stage}, numel=7,500,000,000, world_size=64) "
                                      "should return a dict with keys "
                                      f"params, grads, optimizer, total; got {got!r}")
                if round(got["total"] / 1e9, 1) != gb:
                    raise CheckFailed(f"ZeRO paper, stage {stage}, Ψ = 7.5B, N = 64 (default bytes 2, 2, 12): "
                                      f"expected {gb} GB per GPU, got {got['total'] / 1e9:.2f} GB")
                continue
            if case.kind == "invalid":
                stage, = case.args
                expect_value_error(zero_bytes_per_rank, stage, 100, 2, what=f"zero_bytes_per_rank(stage={stage}, ...)",
                                   why="(stage must be 0, 1, 2 or 3)")
                continue
            _zero_bytes_case(zero_bytes_per_rank, reference, *case.args)
        if check_cases(cases)[1]:
            grade_drawn(_bytes_domain((None, (2, 2, 12), (4, 4, 8), (2, 4, 12), (1, 2, 16))), "zero_bytes_per_rank",
                        DRAWN_FORMULA_CASES, lambda c: _zero_bytes_case(zero_bytes_per_rank, reference, c["stage"],
                                                                        c["numel"], c["world_size"], c["bytes"]))


def _bytes_domain(byte_sizes: tuple) -> dict:
    """Every stage, parameter count (past 2**53, where a float no longer holds every integer) and world size, and
    the bytes per value: the domain of zero_bytes_per_rank's and comm_bytes_per_rank's text."""
    return {"stage": Choice(0, 1, 2, 3), "numel": Sizes(1, 2**62, edges=(1, 7, 2**53 - 1, 2**53 + 1, 2**60 + 3)),
            "world_size": Sizes(1, 4096, edges=(1, 2, 3, 64, 1000)), "bytes": Choice(*byte_sizes)}


DRAWN_FORMULA_CASES = 60  # (pure arithmetic: microseconds a case)


def _zero_bytes_case(zero_bytes_per_rank, reference, stage: int, numel: int, n: int, pgk) -> None:
    args = (stage, numel, n) + (pgk or ())
    what = f"zero_bytes_per_rank(stage={stage}, numel={numel:,}, world_size={n}" + \
           (", {}, {}, {})".format(*pgk) if pgk else ") (default bytes)")
    got = call_learner(zero_bytes_per_rank, *args, what=what)
    want = reference(*args)
    for key in ("params", "grads", "optimizer", "total"):
        if not isinstance(got, dict) or got.get(key) != want[key]:
            have = got.get(key) if isinstance(got, dict) else got
            raise CheckFailed(f"{what}[{key!r}]: expected {want[key]:,} bytes, got {_count(have)} (shards are "
                              f"ceil(numel / world_size) elements; a full buffer is world_size shards, padding "
                              "included)" + (". Above 2**53 a float cannot hold every integer: use integer arithmetic"
                                             if numel >= 2**53 else ""))


# ----------------------------------------------------------------------------- comm_bytes_per_rank

@functools.lru_cache(maxsize=None)  # a function, not a module-level dict (the grader fingerprints those)
def _counted_bytes(stage: int, numel: int, n: int) -> int:
    """The bytes Comm counts per rank per step while the reference optimizer runs the synthetic driver."""
    from memfit.zero import simulate
    return simulate(n, lambda comm: _synthetic_rank(_ref().ZeroAdamW, comm, numel, stage, torch.float32, 2))[0]["sent"][-1]


def _plan_comm_bytes() -> list[Case]:
    plan = []
    for hidden, cases in ((False, ((1_001, 2, 0), (1_001, 3, 1), (1_001, 3, 2), (1_001, 3, 3))),
                          (True, ((998, 5, 0), (998, 4, 1), (998, 5, 2), (998, 7, 3)))):
        for numel, n, stage in cases:
            plan.append(Case("counted", (stage, numel, n), hidden, {"source": "counted by Comm", "stage": stage,
                                                                    "world_size": _world(numel, n), "numel": "small",
                                                                    "bytes": "P = G = 4"}))
    rows = {False: [(s, numel, n, pg) for s in range(4) for numel, n, pg in
                    ((1_000_003, 7, (2, 4)), (1, 1, (2, 2)), (8_030_261_248, 64, None), (12, 4, (4, 4)))],
            True: [(s, numel, n, pg) for s in range(4) for numel in (1, 1_000_003, 8_030_261_248)
                   for n in (1, 2, 7, 64) for pg in ((2, 2), (4, 4), (2, 4))]
                  + [(s, 918_145, 6, None) for s in range(4)]}
    names = {(2, 2): "P = G = 2", (4, 4): "P = G = 4", (2, 4): "P != G", None: "defaults"}
    for hidden, cases in rows.items():
        for stage, numel, n, pg in cases:
            plan.append(Case("formula", (stage, numel, n, pg), hidden, {
                "source": "formula", "stage": stage, "world_size": _world(numel, n), "numel": _size_kind(numel),
                "bytes": names[pg]}))
    return plan


def check_comm_bytes_per_rank(comm_bytes_per_rank, cases: str = "visible") -> None:
    ref = _ref()
    with given_references(comm_bytes_per_rank, **_what_shard_bounds_is()):
        for case in _select(_plan_comm_bytes(), cases):
            if case.kind == "counted":  # against the bytes Comm counted while the reference optimizer ran
                stage, numel, n = case.args
                counted = _counted_bytes(stage, numel, n)
                what = f"comm_bytes_per_rank(stage={stage}, numel={numel:,}, world_size={n}, 4, 4)"
                got = call_learner(comm_bytes_per_rank, stage, numel, n, 4, 4, what=what)
                if got != counted:
                    raise CheckFailed(f"{what}: Comm counted {counted:,} bytes sent per rank per step (a step as "
                                      f"train_ranks runs it), you returned {_count(got)}"
                                      + (f" ({n} ranks do not divide {numel:,}: the shards are padded)"
                                         if numel % n else ""))
                continue
            _comm_bytes_case(comm_bytes_per_rank, ref.comm_bytes_per_rank, *case.args)
        if check_cases(cases)[1]:
            grade_drawn(_bytes_domain((None, (2, 2), (4, 4), (2, 4), (1, 2))), "comm_bytes_per_rank",
                        DRAWN_FORMULA_CASES, lambda c: _comm_bytes_case(
                            comm_bytes_per_rank, ref.comm_bytes_per_rank, c["stage"], c["numel"], c["world_size"],
                            c["bytes"]))


def _comm_bytes_case(comm_bytes_per_rank, reference, stage: int, numel: int, n: int, pg) -> None:
    args = (stage, numel, n) + (pg or ())
    what = f"comm_bytes_per_rank(stage={stage}, numel={numel:,}, world_size={n}" + \
           (", {}, {})".format(*pg) if pg else ") (default bytes)")
    want = reference(*args)
    got = call_learner(comm_bytes_per_rank, *args, what=what)
    if got != want:
        raise CheckFailed(f"{what}: expected {want:,} bytes, got {_count(got)}"
                          + (" (above 2**53 a float cannot hold every integer: use integer arithmetic)"
                             if numel >= 2**53 else ""))


# ------------------------------------------------------------------------------------ zero_on_gloo

def _plan_zero_on_gloo() -> list[Case]:
    tiny, small = _numel_of(TINY), _numel_of(_micro_config())
    plan = []
    for hidden, stages, n_sim in ((False, (1, 3), 3), (True, (0, 2), 5)):
        # ranks that do not divide Ψ, on simulated ranks (a gloo run would need 3+ processes): the stages the gloo
        # cases leave out run; zero_bytes_per_rank is compared at every stage
        sim_stages = tuple(s for s in range(4) if s not in stages)
        plan.append(Case("simulated", (n_sim, sim_stages), hidden, {"ranks": "simulated threads", "stage": sim_stages,
                                                                     "world_size": _world(small, n_sim)}))
        for stage in stages:
            plan.append(Case("gloo", (stage,), hidden, {"ranks": "gloo processes", "stage": stage,
                                                        "world_size": _world(tiny, 2)}))
    return plan


def _formula_total(zero_bytes_per_rank, stage: int, numel: int, n: int) -> dict:
    what = f"zero_bytes_per_rank({stage}, {numel:,}, {n}, 4, 4, 8)"
    with given_references(zero_bytes_per_rank, **_what_shard_bounds_is()):
        got = call_learner(zero_bytes_per_rank, stage, numel, n, 4, 4, 8, what=what)
    if not isinstance(got, dict) or "total" not in got:
        raise CheckFailed(f"{what} should return a dict with keys params, grads, optimizer, total; got {got!r}")
    return got["total"]


def _simulated_ranks_case(ZeroAdamW, zero_bytes_per_rank, n: int, run_stages: tuple) -> None:
    """course-micro trained one step on n simulated ranks at each of run_stages: weights equal to unsharded AdamW,
    each rank's bytes at rest as the stage keeps them; and the learner's zero_bytes_per_rank at every stage."""
    from memfit.zero import reference_training, train_ranks
    micro = _micro_config()
    small = _numel_of(micro)
    want = reference_training(n, cfg=micro, steps=1, opt_args=OPT_ARGS)
    for stage in run_stages:
        reports = _simulate(ZeroAdamW, n, stage, fn=lambda comm: train_ranks(
            ZeroAdamW, comm, stage, cfg=micro, steps=1, opt_args=OPT_ARGS))
        if not torch.equal(reports[0].final, want):
            raise CheckFailed(f"stage {stage}, {n} simulated ranks, {small:,} parameters: the parameters differ "
                              f"from unsharded AdamW: {_stage_hint(stage)}")
        truth = _ref().zero_bytes_per_rank(stage, small, n, 4, 4, 8)["total"]
        for rep in reports:
            if rep.at_rest != truth:
                divides = "divides it" if small % n == 0 else "does not divide it"
                raise CheckFailed(f"stage {stage}, {n} simulated ranks, {small:,} parameters ({n} {divides}), "
                                  f"rank {rep.rank}: {rep.at_rest:,} bytes alive after a step "
                                  f"(measured), but the stage keeps {truth:,} (full buffers padded to "
                                  f"{n} x ceil({small:,}/{n})): {_stage_hint(stage)}")
    for stage in range(4):
        truth = _ref().zero_bytes_per_rank(stage, small, n, 4, 4, 8)["total"]
        predicted = _formula_total(zero_bytes_per_rank, stage, small, n)
        if predicted != truth:
            raise CheckFailed(f"stage {stage}, {n} ranks, {small:,} parameters: a rank keeps {truth:,} bytes at "
                              f"rest (measured alike), your zero_bytes_per_rank predicts {predicted:,} (shards "
                              f"of ceil(numel / world_size), full buffers padded)")


DRAWN_GLOO_CASES = 2


def check_zero_on_gloo(ZeroAdamW, zero_bytes_per_rank, cases: str = "visible") -> None:
    """The learner's optimizer on two gloo processes: weights equal to the reference, memory as predicted; and on
    simulated ranks that do not divide the parameter count, memory as predicted."""
    from memfit.dist import DistributedFailure
    from memfit.gpt import COURSE_CONFIGS
    from memfit.zero import FlatModel, run_distributed_stages, single_rank
    numel = FlatModel.of(COURSE_CONFIGS[TINY]).numel
    plan = _select(_plan_zero_on_gloo(), cases)
    for case in [c for c in plan if c.kind == "simulated"]:  # quick, so first
        _simulated_ranks_case(ZeroAdamW, zero_bytes_per_rank, *case.args)
    if check_cases(cases)[1]:  # drawn on simulated ranks: a gloo case starts processes (seconds each)
        grade_drawn({"world_size": Sizes(2, 9, edges=(2, 3)), "stage": Choice(0, 1, 2, 3)}, "zero_on_gloo",
                    DRAWN_GLOO_CASES, lambda d: _simulated_ranks_case(ZeroAdamW, zero_bytes_per_rank,
                                                                      d["world_size"], (d["stage"],)))
    gloo_stages = [c.args[0] for c in plan if c.kind == "gloo"]
    for stage in gloo_stages:
        with given_references(ZeroAdamW, **_what_shard_bounds_is()):
            call_learner(ZeroAdamW, FlatModel.of(COURSE_CONFIGS[TINY]).initial(), single_rank(), stage)  # a stub
    # every gloo stage in one launch of two processes (starting them costs more than training), one after another
    try:
        runs = run_distributed_stages(ZeroAdamW, 2, gloo_stages, opt_args=OPT_ARGS, timeout_s=90 * len(gloo_stages))
    except DistributedFailure as exc:
        where = ", ".join(map(str, gloo_stages))
        raise CheckFailed(f"stage{'s' if len(gloo_stages) > 1 else ''} {where} on 2 gloo processes (in this order, "
                          f"in the same processes) failed; the ranks' output names the stage:\n"
                          f"{str(exc)[-1500:]}") from None
    for stage in gloo_stages:
        ranks = runs[stage]
        err = ranks[0]["max_rel_error"]
        if not err <= REL_TOL:
            raise CheckFailed(f"stage {stage} on 2 gloo processes: parameters differ from unsharded AdamW by "
                              f"{err:.2e} (allowed {REL_TOL:g}): {_stage_hint(stage)}")
        want = _formula_total(zero_bytes_per_rank, stage, numel, 2)
        truth = _ref().zero_bytes_per_rank(stage, numel, 2, 4, 4, 8)["total"]
        for r in ranks:
            if r["at_rest"] != truth:
                raise CheckFailed(f"stage {stage}, gloo rank {r['rank']}: {r['at_rest']:,} bytes alive after a step "
                                  f"(measured), but the stage keeps {truth:,}: {_stage_hint(stage)}")
        if want != truth:
            raise CheckFailed(f"stage {stage} on 2 gloo processes: each rank measured {truth:,} bytes at rest, your "
                              f"zero_bytes_per_rank predicts {want:,}")


# ------------------------------------------------------------------------- deepspeed_zero3_estimate

LLAMA8B_PARAMS, LLAMA8B_LARGEST = 8_030_261_248, 128_256 * 4096
# What DeepSpeed's estimate_zero3_model_states_mem_needs_all_live prints for Llama-3.1-8B (Ψ above, largest layer the
# 128,256 x 4,096 embedding) in the two settings of the lesson: 4 GPUs with the optimizer offloaded, 8 GPUs without
# offload. DeepSpeed prints bytes / 2**30 with two decimals and labels them "GB"; these are those printed values.
DEEPSPEED_ESTIMATOR_RUNS = [
    (dict(gpus_per_node=4, offload_params=False), "gpu", 5.70),
    (dict(gpus_per_node=4, offload_params=False), "cpu", 179.49),
    (dict(gpus_per_node=8, offload_optimizer=False, offload_params=False), "gpu", 18.78),
]
_OFFLOAD = {(True, True): "parameters and optimizer", (True, False): "optimizer only", (False, False): "none"}


def _estimate_axes(total, kwargs) -> dict:
    off = (kwargs.get("offload_optimizer", True), kwargs.get("offload_params", True))
    return {"offload": _OFFLOAD[off], "zero_init": kwargs.get("zero_init", True),
            "nodes": kwargs.get("nodes", 1), "gpus_per_node": kwargs.get("gpus_per_node", 1),
            "buffer_factor": "default 1.5" if "buffer_factor" not in kwargs else "given",
            "model": "Llama-3.1-8B" if total == LLAMA8B_PARAMS else "other"}


def _plan_deepspeed() -> list[Case]:
    plan = [Case("printed", (kwargs, which, gib), False, _estimate_axes(LLAMA8B_PARAMS, kwargs))
            for kwargs, which, gib in DEEPSPEED_ESTIMATOR_RUNS]
    # nodes are powers of two: 18/nodes and 18·(1/nodes) are then the same float (the text fixes no order)
    visible = [(1_000_001, 77, dict(gpus_per_node=1, nodes=4, zero_init=False)),
               (1_000_003, 77, dict(gpus_per_node=4, nodes=2, offload_params=False, buffer_factor=1.25)),
               (1_000_003, 77, dict(gpus_per_node=8, nodes=2, offload_optimizer=False, offload_params=False,
                                    zero_init=False)),
               (LLAMA8B_PARAMS, LLAMA8B_LARGEST, dict(gpus_per_node=8, nodes=1, offload_optimizer=False,
                                                      offload_params=False, zero_init=True, buffer_factor=2.0)),
               (13_000_000_001, 325_000_003, dict(gpus_per_node=1, nodes=1, offload_params=True, zero_init=False)),
               (1_000_001, 77, dict(gpus_per_node=4, nodes=4, offload_params=False, zero_init=False))]
    plan += [Case("exact", (total, largest, kw), False, _estimate_axes(total, kw)) for total, largest, kw in visible]
    for total, largest in ((LLAMA8B_PARAMS, LLAMA8B_LARGEST), (13_000_000_000, 325_000_000), (1_000_003, 77),
                           (999_999_999, 12_345)):
        for gpn, nodes in ((1, 1), (4, 1), (8, 2), (1, 4), (2, 8)):
            for opt_off, par_off in _OFFLOAD:
                for zero_init in (True, False):
                    kw = dict(gpus_per_node=gpn, nodes=nodes, offload_optimizer=opt_off, offload_params=par_off,
                              zero_init=zero_init)
                    if total == 999_999_999:
                        kw["buffer_factor"] = 1.75
                    plan.append(Case("exact", (total, largest, kw), True, _estimate_axes(total, kw)))
    plan += [Case("invalid", (1000, 10, dict(offload_optimizer=False, offload_params=True)), False,
                  {"invalid": "offload_params without offload_optimizer"}),
             Case("invalid", (10**9, 10**4, dict(gpus_per_node=8, nodes=2, offload_optimizer=False,
                                                 offload_params=True, zero_init=False)), True,
                  {"invalid": "offload_params without offload_optimizer"})]
    return plan


def check_deepspeed_estimate(estimate, cases: str = "visible") -> None:
    for case in _select(_plan_deepspeed(), cases):
        if case.kind == "invalid":
            total, largest, kw = case.args
            expect_value_error(lambda: estimate(total, largest, **kw),
                               what=f"deepspeed_zero3_estimate({total:,}, {largest:,}, {kw})",
                               why="(offloading the parameters needs the optimizer offloaded)")
            continue
        if case.kind == "printed":
            kwargs, which, gib = case.args
            what = f"deepspeed_zero3_estimate({LLAMA8B_PARAMS:,}, {LLAMA8B_LARGEST:,}, {kwargs}) (Llama-3.1-8B)"
            got = call_learner(estimate, LLAMA8B_PARAMS, LLAMA8B_LARGEST, what=what, **kwargs)
            if not (isinstance(got, tuple) and len(got) == 2):
                raise CheckFailed(f"{what} should return (cpu_bytes, gpu_bytes), got {_count(got)}")
            value = got[0 if which == "cpu" else 1]
            if not isinstance(value, (int, float)) or round(value / 2**30, 2) != gib:
                shown = f"{value / 2**30:.2f}" if isinstance(value, (int, float)) else _count(value)
                raise CheckFailed(f"{what}: {which} memory should print as {gib} GiB (bytes / 2**30, as DeepSpeed's "
                                  f"estimator prints it), got {shown}")
            continue
        _check_estimate(estimate, *case.args)
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            opt_off, par_off = drawn["offload"]
            kw = dict(gpus_per_node=drawn["gpus_per_node"], nodes=drawn["nodes"], offload_optimizer=opt_off,
                      offload_params=par_off, zero_init=drawn["zero_init"], buffer_factor=drawn["buffer_factor"])
            _check_estimate(estimate, drawn["total"], min(drawn["largest"], drawn["total"]), kw)
        grade_drawn(DEEPSPEED_DOMAIN, "deepspeed_estimate", DRAWN_DEEPSPEED_CASES, check_one)


# Every call the text allows, up to 10^12 parameters; GPUs per node and nodes are powers of two and buffer factors
# quarters, so every product and quotient is exact in a float and no order of the text's arithmetic differs.
DEEPSPEED_DOMAIN = {"total": Sizes(1, 10**12, edges=(1, LLAMA8B_PARAMS)), "largest": Sizes(1, 10**10, edges=(1,)),
                    "gpus_per_node": Choice(1, 2, 4, 8, 16), "nodes": Choice(1, 2, 4, 8, 32),
                    "offload": Choice(*_OFFLOAD), "zero_init": Choice(True, False),
                    "buffer_factor": Choice(1.5, 1.0, 1.25, 1.75, 2.0)}
DRAWN_DEEPSPEED_CASES = 200


def _check_estimate(estimate, total: int, largest: int, kw: dict) -> None:
    what = f"deepspeed_zero3_estimate({total:,}, {largest:,}, {kw})"
    want = _ref().deepspeed_zero3_estimate(total, largest, **kw)
    got = call_learner(estimate, total, largest, what=what, **kw)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise CheckFailed(f"{what} should return (cpu_bytes, gpu_bytes), got {_count(got)}")
    if got != want or not all(isinstance(x, int) for x in got):
        raise CheckFailed(f"{what}: expected (cpu, gpu) = {_count(want)} bytes, got {_count(got)} (products "
                          "truncated to whole bytes with int(), as DeepSpeed does)")


# ------------------------------------------------------------------------------- prefetch_timeline

def _timeline_axes(compute, gather, sizes, k) -> dict:
    n = len(compute)
    if all(g > c for c, g in zip(compute, gather)):
        regime = "gather-bound"
    elif all(g < c for c, g in zip(compute, gather)):
        regime = "compute-bound"
    else:
        regime = "mixed"
    return {"prefetch": "at least the units" if k >= n else (k if k < 2 else "2 or more"),
            "units": "one" if n == 1 else "several", "regime": regime,
            "times": "integers (ties)" if all(float(x).is_integer() for x in compute + gather) else "fractions",
            "unit_bytes": "equal" if len(set(sizes)) == 1 else "varying"}


def _plan_prefetch() -> list[Case]:
    visible = [([4.0] * 4, [2.0] * 4, [10] * 4, 0), ([4.0] * 4, [2.0] * 4, [10] * 4, 1),
               ([2.0] * 4, [5.0] * 4, [10] * 4, 1),
               ([3.0, 1.0, 4.0, 1.5, 2.0], [1.0, 2.5, 0.5, 3.0, 1.0], [10, 40, 20, 30, 5], 2),
               ([3.25, 1.5, 2.75], [0.5, 0.75, 0.25], [8, 8, 8], 1), ([2.0], [1.0], [7], 1),
               ([1.0, 2.0, 3.0], [2.0, 1.0, 1.0], [5, 9, 3], 3), ([1.0, 1.0, 3.0, 1.0], [1.0, 2.0, 1.0, 2.0], [6, 2, 9, 4], 0)]
    hidden = []
    rng = random.Random(3)
    for i in range(52):
        n = rng.randint(1, 9)
        if i < 40:
            draw = lambda: rng.uniform(0.1, 5)  # noqa: E731
        else:  # whole milliseconds: a gather may start exactly when a unit is freed
            draw = lambda: float(rng.randint(1, 4))  # noqa: E731
        sizes = [rng.randint(1, 100) for _ in range(n)] if i % 7 else [rng.randint(1, 100)] * n
        hidden.append(([draw() for _ in range(n)], [draw() for _ in range(n)], sizes, rng.randint(0, 3)))
    plan = [Case("timeline", args, h, _timeline_axes(*args)) for h, cases in ((False, visible), (True, hidden))
            for args in cases]
    plan += [Case("invalid", args, h, {"invalid": axis}) for h, args, axis in (
        (False, ([1.0], [1.0, 2.0], [1], 1), "lengths differ"), (False, ([1.0, 2.0], [1.0, 2.0], [1], 1), "lengths differ"),
        (False, ([1.0], [1.0], [1], -1), "prefetch < 0"),
        (True, ([1.0, 2.0, 3.0], [1.0, 2.0], [1, 2, 3], 0), "lengths differ"),
        (True, ([1.0, 2.0], [1.0, 2.0], [1, 2, 3], 2), "lengths differ"), (True, ([1.0, 2.0], [1.0, 2.0], [1, 2], -2),
                                                                          "prefetch < 0"))]
    return plan


def check_prefetch_timeline(prefetch_timeline, cases: str = "visible") -> None:
    for case in _select(_plan_prefetch(), cases):
        compute, gather, sizes, k = case.args
        what = f"prefetch_timeline(compute_ms={_short(compute)}, gather_ms={_short(gather)}, " \
               f"unit_bytes={_short(sizes)}, prefetch={k})"
        if case.kind == "invalid":
            expect_value_error(prefetch_timeline, list(compute), list(gather), list(sizes), k, what=what,
                               why=f"({case.axes['invalid']})")
            continue
        _check_timeline(prefetch_timeline, compute, gather, sizes, k)
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            rng, n = random.Random(drawn["seed"]), drawn["units"]
            short, long = ((0.1, 1.0), (2.0, 5.0)) if drawn["times"] == "fractions" else ((1, 1), (2, 4))
            ranges = {"mixed": (short[0], long[1]) * 2, "gather-bound": short + long,
                      "compute-bound": long + short}[drawn["regime"]]  # (compute lo, hi, gather lo, hi)

            def times(lo, hi) -> list[float]:
                return [float(rng.randint(lo, hi)) if isinstance(lo, int) else rng.uniform(lo, hi) for _ in range(n)]
            compute, gather = times(*ranges[:2]), times(*ranges[2:])
            sizes = [rng.randint(1, 100)] * n if drawn["unit_bytes"] == "equal" else \
                [rng.randint(1, 100) for _ in range(n)]
            _check_timeline(prefetch_timeline, compute, gather, sizes, drawn["prefetch"])
        grade_drawn(PREFETCH_DOMAIN, "prefetch_timeline", DRAWN_PREFETCH_CASES, check_one)


PREFETCH_DOMAIN = {"units": Sizes(1, 16, edges=(1, 2)), "prefetch": Sizes(0, 17, edges=(0, 1, 2)),
                   "regime": Choice("mixed", "gather-bound", "compute-bound"),
                   "times": Choice("fractions", "integers (ties)"), "unit_bytes": Choice("equal", "varying")}
DRAWN_PREFETCH_CASES = 100


def _check_timeline(prefetch_timeline, compute, gather, sizes, k) -> None:
    what = f"prefetch_timeline(compute_ms={_short(compute)}, gather_ms={_short(gather)}, " \
           f"unit_bytes={_short(sizes)}, prefetch={k})"
    got = call_learner(prefetch_timeline, list(compute), list(gather), list(sizes), k, what=what)
    want = _ref().prefetch_timeline(compute, gather, sizes, k)
    if not isinstance(got, dict):
        raise CheckFailed(f"{what} should return a dict, got {type(got).__name__}")
    for key, value in want.items():
        have = got.get(key)
        same = (isinstance(have, (list, tuple)) and len(have) == len(value)
                and all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(have, value))) \
            if isinstance(value, list) else (isinstance(have, (int, float))
                                             and math.isclose(have, value, rel_tol=1e-9, abs_tol=1e-9))
        if not same:
            hint = {"peak_bytes": " (a unit holds its bytes from the start of its gather to the end of its "
                                  "compute; one freed at t no longer counts for a gather starting at t)",
                    "exposed_ms": " (total_ms minus the sum of compute_ms)"}.get(key, "")
            raise CheckFailed(f"{what}[{key!r}]: expected {_short(value)}, got {_short(have)}{hint}")


def _short(x):
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(f"{v:.3g}" if isinstance(v, float) else _count(v) for v in x) + "]"
    return f"{x:.6g}" if isinstance(x, float) else _count(x)


# ------------------------------------------------------------------------------------------ the axes

PLANS = {"shard_bounds": _plan_shard_bounds, "zero_adamw": _plan_zero_adamw, "zero_memory": _plan_zero_memory,
         "zero_bytes_per_rank": _plan_zero_bytes, "comm_bytes_per_rank": _plan_comm_bytes,
         "zero_on_gloo": _plan_zero_on_gloo, "deepspeed_estimate": _plan_deepspeed,
         "prefetch_timeline": _plan_prefetch}

_STAGES = (0, 1, 2, 3)
_WORLD = ("divides numel", "does not divide numel")


def _dtype_axis() -> tuple[str, ...]:
    return tuple(dtype_name(d) for d in _dtypes())


AXES = {
    "shard_bounds": {"numel": ("zero", "small", "model-sized", "beyond 2**53"),
                     "world_size": ("one",) + _WORLD + ("more ranks than elements",),
                     "invalid argument": ("world_size < 1", "rank >= world_size", "rank < 0", "numel < 0")},
    "zero_adamw": {"model": ("course GPT", "synthetic gradients"), "stage": _STAGES,
                   "world_size": ("one",) + _WORLD, "param_dtype": _dtype_axis(),
                   "gather_params(out=)": ("None", "given"), "invalid stage": ("above 3", "negative")},
    "zero_memory": {"stage": _STAGES, "param_dtype": _dtype_axis(), "world_size": _WORLD,
                    "model": ("course-tiny", "course-micro")},
    "zero_bytes_per_rank": {"stage": _STAGES, "world_size": ("one",) + _WORLD,
                            "numel": ("one element", "small", "model-sized"),
                            "bytes": ("defaults",) + tuple(_BYTES.values()), "paper": ("ZeRO paper",),
                            "invalid stage": ("above 3", "negative")},
    "comm_bytes_per_rank": {"source": ("counted by Comm", "formula"), "stage": _STAGES,
                            "world_size": ("one",) + _WORLD, "numel": ("one element", "small", "model-sized"),
                            "bytes": ("defaults", "P = G = 2", "P = G = 4", "P != G")},
    "zero_on_gloo": {"ranks": ("gloo processes", "simulated threads"), "stage": _STAGES, "world_size": _WORLD},
    "deepspeed_estimate": {"offload": tuple(_OFFLOAD.values()), "zero_init": (True, False), "nodes": (1, 2, 4),
                           "gpus_per_node": (1, 4, 8), "buffer_factor": ("default 1.5", "given"),
                           "model": ("Llama-3.1-8B", "other"),
                           "invalid": ("offload_params without offload_optimizer",)},
    "prefetch_timeline": {"prefetch": (0, 1, "2 or more", "at least the units"), "units": ("one", "several"),
                          "regime": ("gather-bound", "compute-bound", "mixed"),
                          "times": ("integers (ties)", "fractions"), "unit_bytes": ("equal", "varying"),
                          "invalid": ("lengths differ", "prefetch < 0")},
}


def case_axes(check: str, cases: str) -> list[dict]:
    """The axis values of each case `check` runs under `cases`, read from the plan the check iterates over."""
    return [dict(c.axes) for c in _select(PLANS[check](), cases)]


CHECKS = [
    Check("shard_bounds", 2, check_shard_bounds, uses=("shard_bounds",)),
    Check("zero_adamw", 4, check_zero_adamw, uses=("ZeroAdamW",)),
    Check("zero_memory", 2, check_zero_memory, uses=("ZeroAdamW",)),
    Check("zero_bytes_per_rank", 2, check_zero_bytes_per_rank, uses=("zero_bytes_per_rank",)),
    Check("comm_bytes_per_rank", 1, check_comm_bytes_per_rank, uses=("comm_bytes_per_rank",)),
    Check("zero_on_gloo", 2, check_zero_on_gloo, uses=("ZeroAdamW", "zero_bytes_per_rank"), timeout_s=300),
    Check("deepspeed_estimate", 2, check_deepspeed_estimate, uses=("deepspeed_zero3_estimate",)),
    Check("prefetch_timeline", 2, check_prefetch_timeline, uses=("prefetch_timeline",)),
]
