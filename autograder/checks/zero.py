"""Checks of lesson 03 (solutions/03_zero.ipynb): shards, a sharded AdamW for ZeRO stages 0-3 that must train
the course GPT to the weights of unsharded AdamW, its memory and traffic per rank, the same optimizer on gloo
processes, DeepSpeed's ZeRO-3 estimator and a prefetch timeline.

References come from memfit.from_lessons.zero (extracted from the solution notebook) and from memfit.zero's
training loop and unsharded AdamW; nothing here trusts a number the learner's code reports about itself
without measuring it too.
"""
from __future__ import annotations

import math
import random

import torch

from autograder.checks import Check, CheckFailed, LearnerCodeError, call_learner, check_cases, expect_value_error

TINY = "tiny"
OPT_ARGS = dict(lr=1e-2, eps=1e-3, weight_decay=0.1)  # eps large enough that forgetting to divide by N shows
REL_TOL = 1e-6  # the bound when the reduction order differs from the reference's


def _ref():
    import memfit.from_lessons.zero as ref
    return ref


# ------------------------------------------------------------------------------------ shard_bounds

def check_shard_bounds(shard_bounds, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    plan = ([(10, 4), (12, 4), (918_144, 3)] if visible else []) + \
           ([(1, 1), (1, 3), (0, 2), (7, 8), (1_000_003, 7), (8_030_261_248, 64)] if hidden else [])
    for numel, n in plan:
        bounds = [call_learner(shard_bounds, numel, n, r, what=f"shard_bounds({numel}, {n}, {r})") for r in range(n)]
        size = math.ceil(numel / n)
        for r, b in enumerate(bounds):
            if not (isinstance(b, tuple) and len(b) == 2 and all(isinstance(x, int) for x in b)):
                raise CheckFailed(f"shard_bounds({numel}, {n}, {r}) should return a tuple (start, stop) of ints, "
                                  f"got {b!r}")
            if b != (r * size, (r + 1) * size):
                lengths = [stop - start for start, stop in bounds]
                raise CheckFailed(
                    f"shard_bounds({numel}, {n}, {r}): expected {(r * size, (r + 1) * size)}, got {b}. Every shard has "
                    f"ceil({numel}/{n}) = {size} elements and they follow each other (shard lengths you gave: "
                    f"{lengths[:8]}{'...' if n > 8 else ''}; together they must cover all {numel} elements)")
    if hidden or visible:
        expect_value_error(shard_bounds, 10, 0, 0, what="shard_bounds(10, world_size=0, rank=0)")
        expect_value_error(shard_bounds, 10, 4, 4, what="shard_bounds(10, world_size=4, rank=4)")
    if hidden:
        expect_value_error(shard_bounds, 10, 4, -1, what="shard_bounds(10, world_size=4, rank=-1)")
        expect_value_error(shard_bounds, -1, 4, 0, what="shard_bounds(numel=-1, 4, 0)")


# --------------------------------------------------------------------------------------- ZeroAdamW

def _simulate(ZeroAdamW, world_size: int, stage: int, *, steps: int = 2, param_dtype=torch.float32, cfg=TINY):
    from memfit.zero import SimulationFailed, simulate, train_ranks
    what = f"ZeroAdamW, stage {stage}, {world_size} simulated ranks"
    try:
        return simulate(world_size, lambda comm: train_ranks(ZeroAdamW, comm, stage, cfg=cfg, steps=steps,
                                                             param_dtype=param_dtype, opt_args=OPT_ARGS),
                        timeout_s=60)
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


def check_zero_adamw(ZeroAdamW, cases: str = "visible") -> None:
    from memfit.zero import max_relative_error, reference_training
    visible, hidden = check_cases(cases)
    plan = ([(2, s) for s in range(4)] + [(3, 3)] if visible else []) + \
           ([(1, 2), (3, 0), (3, 1), (3, 2), (4, 1), (4, 3), (5, 2)] if hidden else [])
    steps = 2
    comm_bytes = _ref().comm_bytes_per_rank
    wanted: dict[int, torch.Tensor] = {}
    for n, stage in plan:
        reports = _simulate(ZeroAdamW, n, stage, steps=steps)
        if n not in wanted:
            wanted[n] = reference_training(n, steps=steps, opt_args=OPT_ARGS)
        want = wanted[n]
        got = reports[0].final
        if got.shape != want.shape:
            raise CheckFailed(f"stage {stage}, {n} ranks: gather_params() gave {got.numel()} parameters after "
                              f"slicing to the model's {want.numel()}: return the padded full vector")
        err = max_relative_error(got, want)
        if not err <= REL_TOL:
            raise CheckFailed(
                f"stage {stage}, {n} simulated ranks: after {steps} steps the parameters differ from unsharded "
                f"AdamW by {err:.2e} (max |diff| / max |param|; allowed {REL_TOL:g}). Remember: {_stage_hint(stage)}; "
                "sum, then divide by world_size; torch.optim.AdamW(foreach=False) over your shard")
        sent = reports[-1].sent_per_step
        want_sent = comm_bytes(stage, want.numel(), n, 4, 4)
        if sent != want_sent:
            kinds = ", ".join(k for k, _ in reports[-1].calls) or "none"
            raise CheckFailed(f"stage {stage}, {n} ranks: a step sent {sent:,} bytes per rank through collectives "
                              f"({kinds}); expected {want_sent:,}: {_stage_hint(stage)}")
    if visible or hidden:
        from memfit.zero import single_rank
        expect_value_error(ZeroAdamW, torch.zeros(8), single_rank(), 4, what="ZeroAdamW(params, comm, stage=4)")


# ----------------------------------------------------------------------------- memory of ZeroAdamW

def _memory_case(ZeroAdamW, n: int, stage: int, dtype: torch.dtype) -> None:
    from memfit.zero import FlatModel
    from memfit.gpt import COURSE_CONFIGS
    numel = FlatModel.of(COURSE_CONFIGS[TINY]).numel
    p = torch.empty((), dtype=dtype).element_size()
    k = 8 if dtype == torch.float32 else 12
    want = _ref().zero_bytes_per_rank(stage, numel, n, p, p, k)
    reports = _simulate(ZeroAdamW, n, stage, steps=2, param_dtype=dtype)
    label = f"stage {stage}, {n} ranks, param_dtype {str(dtype).replace('torch.', '')}"
    for r, rep in enumerate(reports):
        for key in ("params", "grads", "optimizer"):
            got = rep.buffers.get(key)
            if got != want[key]:
                what = {"optimizer": " (m and v in fp32" + (", plus the fp32 master copy" if k == 12 else "") + ")",
                        "params": " (in param_dtype)", "grads": " (in param_dtype)"}[key]
                raise CheckFailed(f"{label}, rank {r}: buffers()[{key!r}] holds {got!r} bytes; expected "
                                  f"{want[key]:,}{what}: {_stage_hint(stage)}")
        held = sum(rep.buffers.values())
        if rep.at_rest != held:
            raise CheckFailed(
                f"{label}, rank {r}: after a step the rank keeps {rep.at_rest:,} bytes alive (measured by the "
                f"live-tensor meter) but buffers() lists {held:,}: "
                + ("something else survives the step (a full-size copy, a stored gradient?)" if rep.at_rest > held
                   else "buffers() lists tensors the rank does not hold"))


def check_zero_memory(ZeroAdamW, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    plan = ([(2, s, torch.float32) for s in range(4)] + [(2, 1, torch.bfloat16)] if visible else []) + \
           ([(3, s, torch.bfloat16) for s in range(4)] + [(3, 2, torch.float32), (4, 3, torch.float16)] if hidden else [])
    for n, stage, dtype in plan:
        _memory_case(ZeroAdamW, n, stage, dtype)


# ----------------------------------------------------------------------------- zero_bytes_per_rank

PAPER = [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)]  # Rajbhandari et al., Figure 1: Ψ = 7.5B, N = 64, K = 12


def check_zero_bytes_per_rank(zero_bytes_per_rank, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    reference = _ref().zero_bytes_per_rank
    for stage, gb in PAPER if visible else []:
        got = call_learner(zero_bytes_per_rank, stage, 7_500_000_000, 64)
        if not isinstance(got, dict) or "total" not in got:
            raise CheckFailed(f"zero_bytes_per_rank({stage}, 7.5e9, 64) should return a dict with keys params, "
                              f"grads, optimizer, total; got {got!r}")
        if round(got["total"] / 1e9, 1) != gb:
            raise CheckFailed(f"ZeRO paper, stage {stage}, Ψ = 7.5B, N = 64: expected {gb} GB per GPU, got "
                              f"{got['total'] / 1e9:.2f} GB")
    plan = ([(s, 918_144, 3, 4, 4, 8) for s in range(4)] if visible else []) + \
           ([(s, numel, n, p, g, k) for s in range(4) for numel in (1, 7, 8_030_261_248) for n in (1, 5, 64)
             for p, g, k in ((2, 2, 12), (4, 4, 8), (2, 4, 12))] if hidden else [])
    for stage, numel, n, p, g, k in plan:
        what = f"zero_bytes_per_rank(stage={stage}, numel={numel:,}, world_size={n}, {p}, {g}, {k})"
        got = call_learner(zero_bytes_per_rank, stage, numel, n, p, g, k, what=what)
        want = reference(stage, numel, n, p, g, k)
        for key in ("params", "grads", "optimizer", "total"):
            if not isinstance(got, dict) or got.get(key) != want[key]:
                have = got.get(key) if isinstance(got, dict) else got
                raise CheckFailed(f"{what}[{key!r}]: expected {want[key]:,} bytes, got {have!r} (shards are "
                                  f"ceil(numel / world_size) elements; a full buffer is world_size shards, padding "
                                  "included)")
    expect_value_error(zero_bytes_per_rank, 4, 100, 2, what="zero_bytes_per_rank(stage=4, ...)")


# ----------------------------------------------------------------------------- comm_bytes_per_rank

def check_comm_bytes_per_rank(comm_bytes_per_rank, cases: str = "visible") -> None:
    from memfit.zero import FlatModel
    from memfit.gpt import COURSE_CONFIGS
    visible, hidden = check_cases(cases)
    numel = FlatModel.of(COURSE_CONFIGS[TINY]).numel
    ref = _ref()
    if visible:  # against the bytes Comm counted while the reference optimizer trained
        for n, stage in ((2, 0), (3, 1), (3, 2), (3, 3)):
            counted = _simulate(ref.ZeroAdamW, n, stage)[0].sent_per_step
            got = call_learner(comm_bytes_per_rank, stage, numel, n, 4, 4)
            if got != counted:
                raise CheckFailed(f"comm_bytes_per_rank(stage={stage}, numel={numel:,}, world_size={n}, 4, 4): "
                                  f"Comm counted {counted:,} bytes sent per rank per step, you returned {got!r}")
    plan = [(s, numel_, n, p, g) for s in range(4) for numel_ in (1, 1_000_003, 8_030_261_248)
            for n in (1, 2, 7, 64) for p, g in ((2, 2), (4, 4), (2, 4))] if hidden else []
    for stage, numel_, n, p, g in plan:
        want = ref.comm_bytes_per_rank(stage, numel_, n, p, g)
        got = call_learner(comm_bytes_per_rank, stage, numel_, n, p, g)
        if got != want:
            raise CheckFailed(f"comm_bytes_per_rank(stage={stage}, numel={numel_:,}, world_size={n}, {p}, {g}): "
                              f"expected {want:,}, got {got!r}")


# ------------------------------------------------------------------------------------ zero_on_gloo

def check_zero_on_gloo(ZeroAdamW, zero_bytes_per_rank, cases: str = "visible") -> None:
    """The learner's optimizer on two gloo processes: weights equal to the reference, memory as predicted."""
    from memfit.dist import DistributedFailure
    from memfit.gpt import COURSE_CONFIGS
    from memfit.zero import FlatModel, run_distributed, single_rank
    visible, hidden = check_cases(cases)
    numel = FlatModel.of(COURSE_CONFIGS[TINY]).numel
    plan = ([1, 3] if visible else []) + ([0, 2] if hidden else [])
    for stage in plan:
        call_learner(ZeroAdamW, FlatModel.of(COURSE_CONFIGS[TINY]).initial(), single_rank(), stage)  # a stub fails here
        try:
            ranks = run_distributed(ZeroAdamW, 2, stage, opt_args=OPT_ARGS, timeout_s=90)
        except DistributedFailure as exc:
            raise CheckFailed(f"stage {stage} on 2 gloo processes failed:\n{str(exc)[-1500:]}") from None
        err = ranks[0]["max_rel_error"]
        if not err <= REL_TOL:
            raise CheckFailed(f"stage {stage} on 2 gloo processes: parameters differ from unsharded AdamW by "
                              f"{err:.2e} (allowed {REL_TOL:g}): {_stage_hint(stage)}")
        want = call_learner(zero_bytes_per_rank, stage, numel, 2, 4, 4, 8)["total"]
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
SEED_FIGURES = [  # the lecture's runs, as DeepSpeed prints them (GiB, two decimals)
    (dict(gpus_per_node=4, offload_params=False), "gpu", 5.70),
    (dict(gpus_per_node=4, offload_params=False), "cpu", 179.49),
    (dict(gpus_per_node=8, offload_optimizer=False, offload_params=False), "gpu", 18.78),
]


def check_deepspeed_estimate(estimate, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    if visible:
        for kwargs, which, gib in SEED_FIGURES:
            what = f"deepspeed_zero3_estimate(Llama-3.1-8B, {kwargs})"
            got = call_learner(estimate, LLAMA8B_PARAMS, LLAMA8B_LARGEST, what=what, **kwargs)
            if not (isinstance(got, tuple) and len(got) == 2):
                raise CheckFailed(f"{what} should return (cpu_bytes, gpu_bytes), got {got!r}")
            value = got[0 if which == "cpu" else 1]
            if round(value / 2**30, 2) != gib:
                raise CheckFailed(f"{what}: {which} memory should print as {gib} GiB (bytes / 2**30), got "
                                  f"{value / 2**30:.2f}")
    if hidden:
        reference = _ref().deepspeed_zero3_estimate
        for total, largest in ((LLAMA8B_PARAMS, LLAMA8B_LARGEST), (13_000_000_000, 325_000_000), (1_000_003, 77)):
            for gpn, nodes in ((1, 1), (4, 1), (8, 2)):
                for opt_off, par_off in ((True, True), (True, False), (False, False)):
                    for zero_init in (True, False):
                        kwargs = dict(gpus_per_node=gpn, nodes=nodes, offload_optimizer=opt_off,
                                      offload_params=par_off, zero_init=zero_init)
                        want = reference(total, largest, **kwargs)
                        got = call_learner(estimate, total, largest, **kwargs)
                        if tuple(got) != want:
                            raise CheckFailed(f"deepspeed_zero3_estimate({total:,}, {largest:,}, {kwargs}): expected "
                                              f"(cpu, gpu) = {want}, got {tuple(got)}")
        expect_value_error(lambda: estimate(1000, 10, offload_optimizer=False, offload_params=True),
                           what="deepspeed_zero3_estimate(offload_optimizer=False, offload_params=True)")


# ------------------------------------------------------------------------------- prefetch_timeline

def _timeline_cases(visible: bool, hidden: bool):
    cases = []
    if visible:
        cases += [([4.0] * 4, [2.0] * 4, [10] * 4, 0), ([4.0] * 4, [2.0] * 4, [10] * 4, 1),
                  ([2.0] * 4, [5.0] * 4, [10] * 4, 1)]
    if hidden:
        rng = random.Random(3)
        for _ in range(40):
            n = rng.randint(1, 9)
            cases.append(([rng.uniform(0.1, 5) for _ in range(n)], [rng.uniform(0.1, 5) for _ in range(n)],
                          [rng.randint(1, 100) for _ in range(n)], rng.randint(0, 3)))
    return cases


def check_prefetch_timeline(prefetch_timeline, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    reference = _ref().prefetch_timeline
    for compute, gather, sizes, k in _timeline_cases(visible, hidden):
        what = f"prefetch_timeline(compute_ms={_short(compute)}, gather_ms={_short(gather)}, " \
               f"unit_bytes={sizes}, prefetch={k})"
        got = call_learner(prefetch_timeline, list(compute), list(gather), list(sizes), k, what=what)
        want = reference(compute, gather, sizes, k)
        if not isinstance(got, dict):
            raise CheckFailed(f"{what} should return a dict, got {type(got).__name__}")
        for key, value in want.items():
            have = got.get(key)
            same = (isinstance(have, (list, tuple)) and len(have) == len(value)
                    and all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(have, value))) \
                if isinstance(value, list) else (isinstance(have, (int, float))
                                                 and math.isclose(have, value, rel_tol=1e-9, abs_tol=1e-9))
            if not same:
                raise CheckFailed(f"{what}[{key!r}]: expected {_short(value)}, got {_short(have)}")
    expect_value_error(prefetch_timeline, [1.0], [1.0, 2.0], [1], 1,
                       what="prefetch_timeline with lists of different lengths")


def _short(x):
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in x) + "]"
    return f"{x:.6g}" if isinstance(x, float) else repr(x)


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
