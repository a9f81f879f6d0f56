"""Checks of lesson 05 (solutions/05_flash_attention.ipynb): the online softmax over a stream of blocks, tiled
attention in PyTorch, the Triton forward, the Triton backward in the exercise's three steps (delta alone, then dv,
then dk and dq with the backward's memory), and the memory of forward + backward through autograd.

Numerics follow FlashAttention's rule (autograder/checks/numerics.py): for o, the logsumexp, delta, dq, dk and dv,
the learner's max error against float64 may be at most 2x the error of PyTorch's attention computed in the
same dtype, plus a floor. Every tensor the learner allocates sits between guard regions filled with NaN, so an
element a kernel never writes, or a store past the end, shows up. Sequence lengths are not multiples of the
tiles; inputs come contiguous and in a transformer's transposed layout ((B, N, H, d) viewed as (B, H, N, d));
every dtype of this machine's profile, visible cases included. Memory budgets come from the shapes: O(N·d),
never N², on every call path (each dtype, causal or not), and nothing may stay allocated after a call beyond
what the exercise keeps. A message that names an element names it by its index in each dimension
(numerics.element); a NaN in a PyTorch exercise's result is explained in that exercise's terms (it has no grid).

Each check iterates over case records (ATTN_CASES, SOFTMAX_CASES, MEM_CASES, ...); AXES lists what the
exercises' text lets vary and case_axes reads the same records. With the hidden cases, online_softmax and
attention_tiled also grade cases drawn from their exercise's whole domain (softmax_domain(), tiled_domain();
autograder/checks/domain.py).
"""
from __future__ import annotations

import contextlib
import functools
import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import memfit
import memfit.from_lessons.flash_attention as REFERENCE  # imported before the grading child's guards go up
from autograder.checks import (Check, CheckFailed, KernelSpec, NotImplementedYet, call_learner, check_cases, select,
                               expect_value_error, given_references)
from autograder.checks.domain import Choice, Sizes, grade_drawn
from autograder.checks.numerics import (assert_close_by_rule, call_pure, element, expect_like,
                                        expect_no_torch_arithmetic, guarded_allocations, seeded_generator,
                                        summation_bound)
from autograder.checks.numerics import dtype_name as _name, seeded_randn as _randn
from memfit.hardware import borrowed_configs
from memfit.meter import LIVE_TENSORS, format_bytes, measure_peak


def _dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes this machine's profile grades: fp32 and fp16 on a CPU, bf16 too on a GPU with bf16."""
    return tuple(memfit.profile().dtypes)


def _dtype(slot: int) -> torch.dtype:
    dtypes = _dtypes()
    return dtypes[slot % len(dtypes)]


def _slot_exists(slot: int) -> bool:
    """A case written for a third dtype (bf16) runs only where the profile has one."""
    return slot < len(_dtypes())


_plan = select  # (autograder/checks/__init__.py: one planner for every check module)


# Bytes a call may leave allocated beyond its result: none, up to the CUDA allocator's rounding of each result.
KEPT_SLACK = 4096 if memfit.HAS_GPU else 0


def _check_kept(report, allowed: int, what: str, kept_what: str = "its results") -> None:
    if report.kept_bytes > allowed + KEPT_SLACK:
        raise CheckFailed(f"{what}: {format_bytes(report.kept_bytes)} stay allocated after the call beyond "
                          f"{kept_what} (allowed: {format_bytes(allowed)}): do not keep scratch buffers in globals "
                          "or caches between calls")


# ------------------------------------------------------------------------------------------ inputs

def _in_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values, contiguous or as a transformer hands them over: (B, N, H, d) memory viewed as (B, H, N, d)."""
    return t.transpose(1, 2).contiguous().transpose(1, 2) if layout == "transposed" else t.contiguous()


def _qkv(b, h, n, d, dtype, seed, q_scale=1.0, layout="contiguous"):
    return tuple(_in_layout(t, layout) for t in (_randn((b, h, n, d), dtype, seed, q_scale),
                                                 _randn((b, h, n, d), dtype, seed + 1),
                                                 _randn((b, h, n, d), dtype, seed + 2)))


def _scores(q, k, causal):
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s


def _exact(q, k, v, causal):
    """(o, lse) in float64, from the formula."""
    s = _scores(q.double(), k.double(), causal)
    return torch.softmax(s, dim=-1) @ v.double(), torch.logsumexp(s, dim=-1)


def _bounds(q, k, v, causal):
    """(o's, lse's) per-element error bounds that every right order of attention's sums meets in fp32 accumulation
    (numerics.summation_bound): o sums N products p·v and normalizes by N terms of p, each p off by the error of its
    d-term logit (|Δs| <= γ_d Σ|q k| / √d, relative in p); lse = m + log l carries the logit's error and l's."""
    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    s = _scores(q64, k64, causal)
    p = torch.softmax(s, dim=-1)
    logit = _scores(q64.abs(), k64.abs(), False)  # Σ|q_i k_j| / √d (masked keys have p = 0)
    terms = q.shape[-2] + q.shape[-1]
    o_size = (p * (1 + logit)) @ v64.abs() + (p @ v64).abs()
    lse_size = (p * logit).sum(-1) + 1
    return summation_bound(o_size, terms, q.dtype), summation_bound(lse_size, terms, q.dtype)


def _torch_same(q, k, v, causal):
    """(o, lse) as PyTorch computes them in q's dtype (lse cast to fp32, keeping its error)."""
    return (F.scaled_dot_product_attention(q, k, v, is_causal=causal),
            torch.logsumexp(_scores(q, k, causal), dim=-1).float())


def _expect_pair(got, what: str, names: str):
    if not (isinstance(got, tuple) and len(got) == 2):
        raise CheckFailed(f"{what} should return ({names}), got {type(got).__name__}")
    return got


# Why an element of a PyTorch exercise's result is NaN (numerics' own message speaks of a kernel's mask and grid)
NAN_IN_SOFTMAX = ("computed as NaN: exp(-inf - -inf) for a row whose blocks so far were all -inf (subtract 0 while "
                  "m is still -inf), or an exp that overflowed (subtract the running maximum)")
NAN_IN_TILED = ("computed as NaN: 0 / 0 for a query that saw no key (with the causal mask query i sees keys 0..i, "
                "itself included), exp(-inf - -inf) for a row whose key blocks so far were all masked, or an exp that "
                "overflowed (subtract the running maximum); or never written (every query block stores its rows "
                "of o and lse)")


def _expect_no_nan(got: torch.Tensor, exact: torch.Tensor, what: str, why: str) -> None:
    """CheckFailed naming the first NaN of `got` (where `exact` has none) by its index in each dimension, and why."""
    nan = torch.isnan(got.detach()) & ~torch.isnan(exact.detach().to(got.device))
    if nan.any():
        first = int(nan.flatten().nonzero()[0])
        raise CheckFailed(f"{what}: {int(nan.sum()):,} of {got.numel():,} output elements are NaN, first at "
                          f"{element(got, first)}: {why}")


def _close_in_pytorch(got, exact, same, what: str, why: str, **rule) -> None:
    """assert_close_by_rule for a PyTorch exercise: its NaN explained by `why`."""
    expect_like(got, same, what)
    _expect_no_nan(got, exact, what, why)
    assert_close_by_rule(got, exact, same, what, **rule)


def _check_lse(lse, q, exact_lse, same_lse, what: str, bound=None, nan_why: str | None = None) -> None:
    if not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32 or tuple(lse.shape) != tuple(q.shape[:3]):
        raise CheckFailed(f"{what}: lse should be fp32 of shape {tuple(q.shape[:3])} (one value per query row), got "
                          f"{getattr(lse, 'dtype', type(lse).__name__)} of shape {tuple(getattr(lse, 'shape', ()))}")
    what = what + ", lse (natural log: m + log l)"
    if nan_why:
        _expect_no_nan(lse, exact_lse, what, nan_why)
    assert_close_by_rule(lse, exact_lse, same_lse, what, bound=bound)


# ------------------------------------------------------------------------------------- attention cases

@dataclass(frozen=True)
class AttnCase:
    """One attention problem, run by attention_tiled, flash_forward, flash_delta (its o and dO), flash_backward_dv
    and flash_backward alike."""
    b: int
    h: int
    n: int
    d: int
    causal: bool
    slot: int  # the profile's dtypes[slot % len(dtypes)]
    layout: str = "contiguous"  # or "transposed": (B, N, H, d) memory viewed as (B, H, N, d)
    q_scale: float = 1.0  # 50 puts scores near 100, where exp overflows unless the running max is subtracted
    tiles: tuple | None = (16, 16)  # attention_tiled's (block_m, block_n); None: its defaults (64, 64)
    do_aligned: bool = False  # backward: dO = 2·O + noise (the loss |O|²): Δ is large and dP - Δ cancels
    hidden: bool = False
    gpu: bool = False  # long sequences, graded only where a GPU runs them
    # flash_forward and the backward's: the kernels take the interpreter's tiles (BLOCK_M != BLOCK_N in each) from
    # flash_config on every machine; an H100's own dK/dV and dQ tiles are square, where BLOCK_M for BLOCK_N passes
    small_tiles: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return _dtype(self.slot)

    def describe(self, q_scale=None) -> str:
        q_scale = self.q_scale if q_scale is None else q_scale
        return (f"(B={self.b}, H={self.h}, N={self.n}, d={self.d}, {'causal' if self.causal else 'not causal'}, "
                f"{_name(self.dtype)}{', large logits' if q_scale > 1 else ''}"
                f"{', inputs (B, N, H, d) viewed as (B, H, N, d)' if self.layout == 'transposed' else ''}"
                f"{', flash_config giving the interpreter tiles (BLOCK_M != BLOCK_N)' if self.small_tiles else ''})")

    def tiles_in_force(self):
        """Where flash_config's tiles come from while the learner's kernels run this case."""
        if not self.small_tiles:
            return contextlib.nullcontext()
        return borrowed_configs("cpu", ("flash_forward", "flash_dkdv", "flash_dq"))

    def axes(self, check: str) -> dict:
        n, d = self.n, self.d
        axes = {"dtype": _name(self.dtype), "layout": self.layout,
                "N": "1" if n == 1 else ("a multiple of 32" if n % 32 == 0 else "not a multiple of 16"
                                         if n % 16 else "other"),
                "head_dim": ("128" if d == 128 else "a power of two <= 64" if d & (d - 1) == 0
                             else "not a power of two (BLOCK_D > d)"),
                "batch x heads": "1" if self.b * self.h == 1 else "several"}
        if check in BACKWARD_CHECKS:
            axes["dO"] = "aligned with o (large delta)" if self.do_aligned else "random"
        if check == "flash_delta":  # o and dO only: no mask, no logits, no attention tiles
            return axes
        axes.update({"causal": self.causal, "logits": "large" if self.q_scale > 1 else "moderate"})
        if check == "attention_tiled":
            axes["tiles"] = ("defaults" if self.tiles is None else "block_m > block_n" if self.tiles[0] > self.tiles[1]
                             else "block_m < block_n" if self.tiles[0] < self.tiles[1] else "block_m = block_n")
        if check in ("flash_forward", *BACKWARD_CHECKS):
            axes["kernel tiles"] = "the interpreter's (BLOCK_M != BLOCK_N)" if self.small_tiles else "this machine's"
        return axes


BACKWARD_CHECKS = ("flash_delta", "flash_backward_dv", "flash_backward")  # exercise 4's three steps


ATTN_CASES = [
    AttnCase(1, 2, 1, 48, False, 1, q_scale=50.0),  # N = 1: dS is 0 exactly, any error in delta shows
    AttnCase(1, 2, 17, 32, True, 1, "transposed", tiles=(16, 8)),
    AttnCase(2, 1, 64, 64, False, 1, tiles=(8, 16), do_aligned=True),
    AttnCase(1, 1, 40, 80, True, 0, "transposed", tiles=None, do_aligned=True, small_tiles=True),
    AttnCase(1, 1, 40, 32, False, 0, q_scale=50.0, tiles=(32, 16)),
    AttnCase(1, 1, 24, 128, True, 2, tiles=(8, 8)),
    AttnCase(1, 1, 33, 48, False, 1, q_scale=50.0, tiles=(16, 32)),
    # hidden: other sizes and values, the same kinds
    AttnCase(1, 2, 257, 80, True, 1, "transposed", tiles=(16, 8), hidden=True),
    AttnCase(1, 1, 100, 96, False, 0, tiles=(8, 16), do_aligned=True, hidden=True, small_tiles=True),
    AttnCase(1, 2, 77, 128, True, 2, "transposed", tiles=None, hidden=True),
    AttnCase(2, 2, 33, 16, False, 1, "transposed", tiles=(32, 32), hidden=True),
    AttnCase(1, 1, 50, 64, True, 0, q_scale=50.0, tiles=(64, 64), hidden=True),
    AttnCase(2, 1, 1, 48, False, 1, q_scale=50.0, tiles=(16, 16), hidden=True),
    AttnCase(1, 1, 96, 32, True, 1, tiles=(32, 16), do_aligned=True, hidden=True, small_tiles=True),
    AttnCase(2, 3, 1000, 64, True, 0, tiles=(64, 32), hidden=True, gpu=True, small_tiles=True),
    AttnCase(1, 2, 4097, 128, False, 1, "transposed", tiles=None, hidden=True, gpu=True),
    AttnCase(1, 2, 2048, 96, True, 2, tiles=(32, 64), hidden=True, gpu=True),
]


def _attn_plan(cases: str, max_n: int | None = None) -> list[AttnCase]:
    return [c for c in _plan(ATTN_CASES, cases) if (memfit.HAS_GPU or not c.gpu) and (max_n is None or c.n <= max_n)]


def _inputs(case: AttnCase, seed: int, q_scale=None):
    return _qkv(case.b, case.h, case.n, case.d, case.dtype, seed, case.q_scale if q_scale is None else q_scale,
                case.layout)


# ---------------------------------------------------------------------------------- online softmax

def _one_pass(blocks):
    """A generator over the blocks that can be read once (no going back)."""
    yield from blocks


@dataclass(frozen=True)
class SoftmaxCase:
    rows: int
    widths: tuple
    offset: float  # added to every value: 500 or 1000 overflow exp without the max, -800 underflows it
    pattern: str | None  # -inf entries: "first" (whole leading blocks of some rows), "scattered"
    slot: int
    hidden: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return _dtype(self.slot)

    def axes(self) -> dict:
        w = self.widths
        shape = (["one"] if len(w) == 1 else ["several"]) + (["width 1"] if 1 in w else []) + \
                (["uneven widths"] if len(set(w)) > 1 else [])
        return {"dtype": _name(self.dtype), "blocks": tuple(shape), "rows": "one" if self.rows == 1 else "several",
                "values": "moderate" if self.offset == 0 else "large positive" if self.offset > 0 else "large negative",
                "-inf entries": self.pattern or "none"}


SOFTMAX_CASES = [
    SoftmaxCase(4, (8, 8, 8, 8, 5), 0.0, None, 0), SoftmaxCase(3, (100, 100), 500.0, None, 1),
    SoftmaxCase(5, (4, 4, 4), 0.0, "first", 0), SoftmaxCase(1, (7,), -300.0, None, 1),
    SoftmaxCase(2, (1, 3, 1, 2), 0.0, "scattered", 1), SoftmaxCase(3, (6, 6), 0.0, "first", 2),
    SoftmaxCase(7, (1,) * 13, 0.0, None, 0, True), SoftmaxCase(2, (64, 3), -800.0, None, 1, True),
    SoftmaxCase(6, (16, 16, 16, 16), 0.0, "scattered", 0, True), SoftmaxCase(3, (5, 5, 5, 5), 1000.0, "first", 1, True),
    SoftmaxCase(1, (30,), 0.0, None, 0, True), SoftmaxCase(4, (9, 2), 0.0, "first", 2, True),
]


def _check_softmax(online_softmax_stats, case: SoftmaxCase, seed: int) -> None:
    rows, widths, offset, pattern = case.rows, list(case.widths), case.offset, case.pattern
    x = (_randn((rows, sum(widths)), torch.float32, seed, scale=4.0) + offset).to(case.dtype)
    if pattern == "first":  # some rows see only -inf in the first blocks (left padding)
        x[::2, : sum(widths[:-1])] = float("-inf")
    elif pattern == "scattered":
        gen = seeded_generator(seed)
        masked = torch.rand(x.shape, generator=gen) < 0.5
        masked[:, -1] = False
        x[masked.to(x.device)] = float("-inf")
    what = f"online_softmax_stats over {rows} rows of {_name(case.dtype)} in blocks of widths {widths}" + (
        f", values near {offset:g}" if offset else "") + (f", -inf entries ({pattern})" if pattern else "")

    @functools.wraps(online_softmax_stats)
    def over_a_generator(*blocks):
        return online_softmax_stats(_one_pass(blocks))

    got = _expect_pair(call_pure(over_a_generator, *x.split(widths, dim=1), what=what), what, "m, l")
    m, l = got
    exact_m = x.double().amax(dim=1)
    expect_like(m, exact_m.float(), what + ", m")
    if not torch.equal(m.double(), exact_m):
        bad = int((m.double() != exact_m).nonzero()[0])
        raise CheckFailed(f"{what}: m should be each row's maximum; at {element(m, bad)} (row {bad}): expected "
                          f"{exact_m[bad].item():g}, got {m[bad].item():g}")
    exact_l = torch.exp(x.double() - exact_m[:, None]).sum(dim=1)
    xf = x.float()
    same_l = torch.exp(xf - xf.amax(dim=1, keepdim=True)).sum(dim=1)
    # Any right order: each term's exp and each block's rescaling (an exp and a product) round, and the sum of
    # positive terms adds a rounding per term, so l is within (terms + 3 blocks + 2) fp32 roundoffs of itself (PyTorch's
    # one-pass error on a row can be far smaller: the rule alone once failed the reference on 98 terms in 10 blocks).
    roundings = x.shape[1] + 3 * len(widths) + 2
    bound = roundings * torch.finfo(torch.float32).eps / 2 * exact_l.abs()
    _close_in_pytorch(l, exact_l, same_l, what + ", l (the sum of exp(x - m))", NAN_IN_SOFTMAX, bound=bound)


def softmax_domain() -> dict:
    """Every input the text allows: any rows, any number of blocks of any widths, each dtype, values that overflow
    or underflow exp without the running max, -inf entries (each row finite somewhere: its last column)."""
    return {"rows": Sizes(1, 16, edges=(1, 2)), "blocks": Sizes(1, 12, edges=(1, 2)),
            "width": Sizes(1, 64, edges=(1, 2)), "widths": Choice("equal", "ragged last", "uneven"),
            "values": Choice(0.0, 500.0, -800.0, 1000.0, -300.0, 80.0), "pattern": Choice("none", "first", "scattered"),
            "dtype": Choice(*_names(_dtypes()))}


def _drawn_widths(blocks: int, width: int, kind: str, seed: int) -> tuple:
    rng = random.Random(seed)
    if kind == "equal":
        return (width,) * blocks
    if kind == "ragged last":
        return (width,) * (blocks - 1) + (rng.randint(1, width),)
    return tuple(rng.randint(1, width) for _ in range(blocks))


DRAWN_SOFTMAX_CASES = 12  # (about 1 ms each)


def check_online_softmax(online_softmax_stats, cases: str = "visible") -> None:
    records = _plan(SOFTMAX_CASES, cases)  # a third-dtype case runs in fp32 where there is no bf16
    for seed, case in enumerate(records):
        _check_softmax(online_softmax_stats, case, seed)
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            widths = _drawn_widths(drawn["blocks"], drawn["width"], drawn["widths"], drawn["seed"])
            case = SoftmaxCase(drawn["rows"], widths, drawn["values"],
                               None if drawn["pattern"] == "none" else drawn["pattern"],
                               _names(_dtypes()).index(drawn["dtype"]), True)
            _check_softmax(online_softmax_stats, case, drawn["seed"])
        grade_drawn(softmax_domain(), "online_softmax", DRAWN_SOFTMAX_CASES, check_one)


# ---------------------------------------------------------------------------------- tiled attention

@dataclass(frozen=True)
class MemCase:
    """One memory measurement: a sequence length (CPU; x16 on a GPU), a dtype slot, a mask."""
    n: int
    slot: int
    causal: bool
    hidden: bool = False
    layout: str = "contiguous"  # or "transposed": (B, N, H, d) leaves seen as (B, H, N, d), as a model's heads are

    @property
    def dtype(self) -> torch.dtype:
        return _dtype(self.slot)

    @property
    def seq(self) -> int:
        return self.n * 16 if memfit.HAS_GPU else self.n

    def axes(self) -> dict:
        return {"memory dtype": _name(self.dtype), "memory causal": self.causal, "memory layout": self.layout}


# Lengths not used by the numerics cases (a cache keyed by size cannot hide), visible and hidden apart.
MEM_CASES = [MemCase(128, 0, True), MemCase(112, 1, False), MemCase(144, 2, True), MemCase(96, 1, True, layout="transposed"),
             MemCase(160, 1, True, True), MemCase(176, 0, False, True), MemCase(208, 2, False, True),
             MemCase(80, 0, False, True, "transposed")]


def _mem_plan(cases: str) -> list[MemCase]:
    return [c for c in _plan(MEM_CASES, cases) if _slot_exists(c.slot)]


def _check_tiled(attention_tiled, case: AttnCase, seed: int) -> None:
    q, k, v = _inputs(case, seed)
    if case.tiles is None:
        what = f"attention_tiled{case.describe()} with the default block sizes"
        args = (q, k, v, case.causal)
    else:
        what = f"attention_tiled{case.describe()} with block_m={case.tiles[0]}, block_n={case.tiles[1]}"
        args = (q, k, v, case.causal, *case.tiles)
    o, lse = _expect_pair(call_pure(attention_tiled, *args, what=what), what, "o, lse")
    exact_o, exact_lse = _exact(q, k, v, case.causal)
    same_o, same_lse = _torch_same(q, k, v, case.causal)
    o_bound, lse_bound = _bounds(q, k, v, case.causal)
    _close_in_pytorch(o, exact_o, same_o, what + ", o", NAN_IN_TILED, bound=o_bound)
    _check_lse(lse, q, exact_lse, same_lse, what, lse_bound, nan_why=NAN_IN_TILED)


def tiled_domain() -> dict:
    """Every call the text allows: any B, H, N and head dim, causal or not, block sizes of the caller's (equal,
    unequal, neither a multiple of the other, the defaults), each dtype, contiguous or transposed views, logits
    moderate or large (autograder/checks/domain.py draws hidden cases from it)."""
    return {"n": Sizes(1, 300, edges=(1, 2, 15, 16, 17, 23, 24, 25, 31, 32, 33, 40, 63, 64, 65)),
            "d": Sizes(1, 128, edges=(1, 16, 64, 80, 128)), "b": Sizes(1, 2), "h": Sizes(1, 3),
            "causal": Choice(False, True),
            "tiles": Choice((16, 16), (8, 16), (16, 8), (32, 16), (16, 32), (24, 40), (40, 24), "defaults"),
            "dtype": Choice(*_names(_dtypes())), "layout": Choice("contiguous", "transposed"),
            "logits": Choice("moderate", "large")}


DRAWN_TILED_CASES = 16


def check_attention_tiled(attention_tiled, cases: str = "visible") -> None:
    for seed, case in enumerate(_attn_plan(cases, max_n=1000)):
        _check_tiled(attention_tiled, case, 10 * seed)
    for i, case in enumerate(_mem_plan(cases)):
        n = case.seq if memfit.HAS_GPU else 2 * case.seq  # a Python loop per tile: on a GPU, launches
        b, h, d, block = 1, 2, 32, (32, 32) if i % 2 == 0 else (16, 32)
        q, k, v = _qkv(b, h, n, d, case.dtype, 99 + i)
        what = (f"attention_tiled(B={b}, H={h}, N={n}, d={d}, {'causal' if case.causal else 'not causal'}, "
                f"{_name(case.dtype)}, block_m={block[0]}, block_n={block[1]})")
        _, report = measure_peak(lambda: call_learner(attention_tiled, q, k, v, case.causal, *block, what=what),
                                 device=memfit.DEVICE, warmup=False)
        outputs = b * h * n * (d * q.element_size() + 4)
        tile_work = 8 * b * h * (block[0] * block[1] + 2 * max(block) * d) * 4
        if report.peak_bytes > outputs + tile_work:
            raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds o and lse "
                              f"({format_bytes(outputs)}) plus a few fp32 tiles ({format_bytes(tile_work)}); the "
                              f"full score matrix alone is {format_bytes(b * h * n * n * 4)}: keep S and P to one "
                              "(block_m x block_n) tile at a time")
        _check_kept(report, 0, what, "o and lse")
    if check_cases(cases)[1]:
        def check_one(drawn: dict) -> None:
            case = AttnCase(drawn["b"], drawn["h"], drawn["n"], drawn["d"], drawn["causal"],
                            _names(_dtypes()).index(drawn["dtype"]), drawn["layout"],
                            50.0 if drawn["logits"] == "large" else 1.0,
                            None if drawn["tiles"] == "defaults" else drawn["tiles"], hidden=True)
            _check_tiled(attention_tiled, case, drawn["seed"])
        grade_drawn(tiled_domain(), "attention_tiled", DRAWN_TILED_CASES, check_one)


# ------------------------------------------------------------------------------------- Triton forward

@dataclass(frozen=True)
class InvalidCase:
    """Arguments flash_attention_forward must refuse with a ValueError."""
    bad: str  # "length", "dtype", "head_dim"
    hidden: bool = False

    def axes(self) -> dict:
        return {"invalid input": self.bad}


INVALID_CASES = [InvalidCase("length"), InvalidCase("dtype"), InvalidCase("head_dim"),
                 InvalidCase("length", True), InvalidCase("dtype", True), InvalidCase("head_dim", True)]


def _expect_invalid(flash_attention_forward, case: InvalidCase) -> None:
    n, d = (20, 32) if not case.hidden else (9, 16)
    q, k, v = _qkv(1, 2, n, d, torch.float32, 5)
    if case.bad == "length":
        args, what, why = ((q, k[:, :, :-1], v) if not case.hidden else (q, k, v[:, :, 1:]),
                           "k shorter than q" if not case.hidden else "v shorter than q", "naming the shapes")
    elif case.bad == "dtype":
        args, what, why = ((q, k, v.half()) if not case.hidden else (q.half(), k, v),
                           "v in fp16 and q, k in fp32" if not case.hidden else "q in fp16 and k, v in fp32",
                           "naming the dtypes")
    else:
        wide = _randn((1, 1, 4, 256 if not case.hidden else 192), torch.float32, 6)
        args, what, why = (wide, wide, wide), f"head_dim {wide.shape[-1]}", "naming the head dim limit"
    expect_value_error(flash_attention_forward, *args, what=f"flash_attention_forward with {what}", why=why)


def flash_domain() -> dict:
    """Every call the text allows of the Triton kernels (attention_tiled's domain, head dims up to the kernels' 128),
    each with this machine's tiles or the interpreter's, whose BLOCK_M and BLOCK_N differ, and (the backward's) dO
    random or aligned with o. Sequences up to 100: the interpreter runs a program at a time."""
    domain = {k: v for k, v in tiled_domain().items() if k != "tiles"}
    return {**domain, "n": Sizes(1, 100, edges=(1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65)),
            "kernel tiles": Choice("this machine's", "the interpreter's"), "dO": Choice("random", "aligned with o")}


DRAWN_FLASH_CASES = 3  # per check: each runs every program of a grid in Triton's interpreter on a CPU


def _drawn_attn_case(drawn: dict) -> AttnCase:
    return AttnCase(drawn["b"], drawn["h"], drawn["n"], drawn["d"], drawn["causal"],
                    _names(_dtypes()).index(drawn["dtype"]), drawn["layout"],
                    50.0 if drawn["logits"] == "large" else 1.0, None, drawn["dO"] == "aligned with o", hidden=True,
                    small_tiles=drawn["kernel tiles"] != "this machine's")


def _grade_drawn_flash(check: str, cases: str, run_case) -> None:
    if check_cases(cases)[1]:
        grade_drawn(flash_domain(), check, DRAWN_FLASH_CASES, lambda d: run_case(_drawn_attn_case(d), d["seed"]))


def _forward_case(flash_attention_forward, case: AttnCase, seed: int) -> None:
    q, k, v = _inputs(case, seed)
    what = f"flash_attention_forward{case.describe()}"
    with guarded_allocations(), case.tiles_in_force():
        got = call_pure(flash_attention_forward, q, k, v, case.causal, what=what)
    o, lse = _expect_pair(got, what, "o, lse")
    exact_o, exact_lse = _exact(q, k, v, case.causal)
    same_o, same_lse = _torch_same(q, k, v, case.causal)
    o_bound, lse_bound = _bounds(q, k, v, case.causal)
    assert_close_by_rule(o, exact_o, same_o, what + ", o", bound=o_bound)
    _check_lse(lse, q, exact_lse, same_lse, what, lse_bound)


def check_flash_forward(flash_attention_forward, cases: str = "visible") -> None:
    for seed, case in enumerate(_attn_plan(cases)):
        _forward_case(flash_attention_forward, case, 10 * seed)
    for case in _plan(INVALID_CASES, cases):
        _expect_invalid(flash_attention_forward, case)
    _grade_drawn_flash("flash_forward", cases, lambda case, seed: _forward_case(flash_attention_forward, case, seed))


_MEM_BHD = (1, 2, 64)


def memory_domain() -> dict:
    """Every measured call: sequence lengths up to a few hundred (times 16 on a GPU), each dtype the profile has, causal
    or not, q, k, v contiguous or transposed (B, N, H, d) views (the autograd function's)."""
    return {"n": Sizes(16, 224, edges=(16, 17, 64, 65)), "slot": Choice(*(i for i in range(3) if _slot_exists(i))),
            "causal": Choice(True, False), "layout": Choice("contiguous", "transposed")}


DRAWN_MEMORY_CASES = 1  # per memory check: each measures a forward (and a backward) of the kernels interpreted


def _drawn_mem_case(d: dict) -> MemCase:
    return MemCase(d["n"], d["slot"], d["causal"], True, d["layout"])


def check_flash_forward_memory(flash_attention_forward, cases: str = "visible") -> None:
    for i, case in enumerate(_mem_plan(cases)):
        _forward_memory_case(flash_attention_forward, case, 21 + i)
    if check_cases(cases)[1]:
        grade_drawn(memory_domain(), "flash_forward_memory", DRAWN_MEMORY_CASES,
                    lambda d: _forward_memory_case(flash_attention_forward, _drawn_mem_case(d), d["seed"] % 1000))


def _forward_memory_case(flash_attention_forward, case: MemCase, seed: int) -> None:
    (b, h, d), n = _MEM_BHD, case.seq
    q, k, v = _qkv(b, h, n, d, case.dtype, seed)
    what = (f"flash_attention_forward(B={b}, H={h}, N={n}, d={d}, {'causal' if case.causal else 'not causal'}, "
            f"{_name(case.dtype)})")
    (o, lse), report = measure_peak(
        lambda: call_learner(flash_attention_forward, q, k, v, case.causal, what=what), device=memfit.DEVICE)
    budget = math.ceil(1.05 * (q.numel() * q.element_size() + b * h * n * 4))
    if report.peak_bytes > budget:
        raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds o and lse "
                          f"({format_bytes(budget)} with 5%); the scores alone would be "
                          f"{format_bytes(b * h * n * n * 4)}: keep every tile in the kernel, and write o in "
                          "q's dtype from the kernel (no copies of q, k, v or o in PyTorch)")
    _check_kept(report, 0, what, "o and lse")
    del o, lse
    if report.ops is None or report.meter != LIVE_TENSORS:
        _, report = measure_peak(lambda: call_learner(flash_attention_forward, q, k, v, case.causal, what=what),
                                 device=memfit.DEVICE, meter=LIVE_TENSORS, warmup=False)
    expect_no_torch_arithmetic(report.ops, what, "the attention belongs in your Triton kernel")


# ------------------------------------------------------------------------------------- Triton backward

def _gradient_floor_ulps(dtype: torch.dtype, n: int) -> float:
    """The rule's floor for gradients, in units of the dtype's epsilon times the largest gradient. A gradient
    sums N products: in fp32, FlashAttention's order of summation and PyTorch's round differently by about
    sqrt(N) ulps, which can exceed 2x PyTorch's own tiny error; 8 sqrt(N) ulps (7e-6 of the largest entry at
    N = 40, 4e-5 at N = 2048) is still far below any mistake. In fp16 and bf16 PyTorch's error dominates."""
    return 8 * math.sqrt(n) if dtype == torch.float32 else 2.0


def _exact_and_same_grads(q, k, v, do, causal):
    grads = {}
    for key, cast in (("exact", torch.Tensor.double), ("same", lambda t: t)):
        leaves = [cast(t).detach().clone().requires_grad_(True) for t in (q, k, v)]
        if key == "exact":
            o = torch.softmax(_scores(leaves[0], leaves[1], causal), dim=-1) @ leaves[2]
        else:
            o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        o.backward(cast(do))
        grads[key] = [t.grad for t in leaves]
    return grads["exact"], grads["same"]


def _upstream(case: AttnCase, exact_o: torch.Tensor, seed: int) -> torch.Tensor:
    noise = _randn(tuple(exact_o.shape), case.dtype, seed)
    do = (2 * exact_o + 0.05 * noise.double()).to(case.dtype) if case.do_aligned else noise
    return _in_layout(do, case.layout)


def _backward_inputs(case: AttnCase, seed: int):
    """(q_scale, (q, k, v), do, o, lse) of a backward case: o and lse exact, rounded as forward would return them.
    Backward exponentiates S - lse <= 0 whatever the logits: no overflow to provoke. Logits near 100 only make fp32
    gradients ill-conditioned (PyTorch's own error is then noise), so peaked but moderate ones."""
    q_scale = min(case.q_scale, 4.0)
    q, k, v = _inputs(case, 10 * seed, q_scale)
    exact_o, exact_lse = _exact(q, k, v, case.causal)
    do = _upstream(case, exact_o, 10 * seed + 7)
    return q_scale, (q, k, v), do, _in_layout(exact_o.to(case.dtype), case.layout), exact_lse.float()


def _close(got, exact, same, what: str, **rule) -> str | None:
    """assert_close_by_rule's message, or None when `got` meets the rule."""
    try:
        assert_close_by_rule(got, exact, same, what, **rule)
    except CheckFailed as exc:
        return str(exc)
    return None


# ----------------------------------------------------------------------------- step 1: delta alone

def _delta_what(case: AttnCase) -> str:
    return (f"flash_delta(o, do of shape (B={case.b}, H={case.h}, N={case.n}, d={case.d}), {_name(case.dtype)}"
            f"{', (B, N, H, d) viewed as (B, H, N, d)' if case.layout == 'transposed' else ''}"
            f"{', do = 2·o + noise' if case.do_aligned else ''})")


def _check_delta_value(delta, o, do, what: str) -> None:
    shape = tuple(o.shape[:3])
    if not isinstance(delta, torch.Tensor) or delta.dtype != torch.float32 or tuple(delta.shape) != shape:
        raise CheckFailed(f"{what}: delta should be fp32 of shape {shape} (one value per query row), got "
                          f"{getattr(delta, 'dtype', type(delta).__name__)} of shape "
                          f"{tuple(getattr(delta, 'shape', ()))}")
    o64, do64 = o.double(), do.double()
    exact = (o64 * do64).sum(-1)
    same = (o.float() * do.float()).sum(-1)
    bound = summation_bound((o64.abs() * do64.abs()).sum(-1), o.shape[-1], torch.float32)
    what = what + ", delta"
    _expect_no_nan(delta, exact, what, "never written (launch programs for every row of each head, cdiv(N, BLOCK_M) "
                                       "of them, and mask the rows past N) or computed as NaN")
    failed = _close(delta, exact, same, what, bound=bound)
    if failed:
        raise CheckFailed(f"{failed}; delta[b, h, i] = Σ over c of do[b, h, i, c] · o[b, h, i, c], each product and "
                          "the sum in fp32")


def _delta_case(flash_delta, case: AttnCase, seed: int) -> None:
    _, _, do, o, _ = _backward_inputs(case, seed)
    what = _delta_what(case)
    with guarded_allocations(what):
        delta = call_pure(flash_delta, o, do, what=what)
    _check_delta_value(delta, o, do, what)


def check_flash_delta(flash_delta, cases: str = "visible") -> None:
    """Step 1 of exercise 4: delta = rowsum(dO ⊙ O) in fp32, one value per query row, from a kernel."""
    for seed, case in enumerate(_attn_plan(cases)):
        _delta_case(flash_delta, case, seed)
    _grade_drawn_flash("flash_delta", cases, lambda case, seed: _delta_case(flash_delta, case, seed))
    for i, case in enumerate(_mem_plan(cases)):
        (b, h, d), n = _MEM_BHD, case.seq
        o, do = _randn((b, h, n, d), case.dtype, 71 + i), _randn((b, h, n, d), case.dtype, 72 + i)
        what = f"flash_delta(o, do of shape (B={b}, H={h}, N={n}, d={d}), {_name(case.dtype)})"
        delta, report = measure_peak(lambda: call_learner(flash_delta, o, do, what=what), device=memfit.DEVICE)
        budget = math.ceil(1.05 * b * h * n * 4)
        if report.peak_bytes > budget:
            raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds delta, one fp32 "
                              f"per row ({format_bytes(budget)} with 5%): the product do * o alone would be "
                              f"{format_bytes(b * h * n * d * 4)} in fp32; multiply and sum in the kernel, a tile "
                              "at a time")
        _check_kept(report, 0, what, "delta")
        _check_delta_value(delta, o, do, what)
        del delta
        if report.ops is None or report.meter != LIVE_TENSORS:
            _, report = measure_peak(lambda: call_learner(flash_delta, o, do, what=what), device=memfit.DEVICE,
                                     meter=LIVE_TENSORS, warmup=False)
        expect_no_torch_arithmetic(report.ops, what, "delta belongs in your flash_delta_kernel")


# -------------------------------------------------------------- steps 2 and 3: dv, then dk and dq

def _given_delta(flash_attention_backward):
    """The course's flash_delta in place of the learner's while their backward runs: a mistake in step 1 costs
    step 1's point only (a backward that computes delta without calling flash_delta is left as it is)."""
    return given_references(flash_attention_backward, flash_delta=REFERENCE.flash_delta)


def _backward_grads(flash_attention_backward, case: AttnCase, seed: int):
    """(what, (dq, dk, dv) as returned, exact grads, PyTorch's grads in the same dtype, the gradients' floor)."""
    q_scale, (q, k, v), do, o, lse = _backward_inputs(case, seed)
    what = f"flash_attention_backward{case.describe(q_scale)}" + (", dO = 2·o + noise" if case.do_aligned else "")
    with guarded_allocations(), case.tiles_in_force(), _given_delta(flash_attention_backward):
        got = call_pure(flash_attention_backward, do, q, k, v, o, lse, case.causal, what=what)
    if not (isinstance(got, tuple) and len(got) == 3):
        raise CheckFailed(f"{what} should return (dq, dk, dv), got {type(got).__name__}")
    exact, same = _exact_and_same_grads(q, k, v, do, case.causal)
    return what, got, exact, same, dict(floor_ulps=_gradient_floor_ulps(case.dtype, case.n))


DV_HINT = ("dv = Pᵀ dO needs neither delta nor dq: look at flash_dkdv_kernel and _dkdv_from (P = exp(S·scale - lse) "
           "recomputed, its masks, the query blocks each key block visits), at the store of dv and at the kernel's "
           "launch")


def check_flash_backward_dv(flash_attention_backward, cases: str = "visible") -> None:
    """Step 2 of exercise 4: dv alone (dv = Pᵀ dO: the dK/dV kernel's P, masks and loops, without delta)."""
    for seed, case in enumerate(_attn_plan(cases)):
        _dv_case(flash_attention_backward, case, seed)
    _grade_drawn_flash("flash_backward_dv", cases,
                       lambda case, seed: _dv_case(flash_attention_backward, case, seed))


def _dv_case(flash_attention_backward, case: AttnCase, seed: int) -> None:
    what, (_, _, dv), exact, same, rule = _backward_grads(flash_attention_backward, case, seed)
    failed = _close(dv, exact[2], same[2], f"{what}, dv", **rule)
    if failed:
        raise CheckFailed(f"{failed}; {DV_HINT}")


def _cancellation_bounds(case: AttnCase, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element bounds for dq and dk from dS = P ⊙ (dP - delta): where dP and delta nearly cancel (one key, N = 1,
    makes dS zero exactly), any order of computing them leaves an error of their size, not of dS's. The bound is the
    any-order summation bound of dS's terms, P·(Σ|dO||v| + Σ|dO||o|), carried through dq = dS K·scale and
    dk = dSᵀ Q·scale."""
    _, (q, k, v), do, o, _ = _backward_inputs(case, seed)
    q64, k64, v64, do64, o64 = (t.detach().double() for t in (q, k, v, do, o))
    p = torch.softmax(_scores(q64, k64, case.causal), dim=-1)
    size = p * (do64.abs() @ v64.abs().transpose(-2, -1) + (do64.abs() * o64.abs()).sum(-1, keepdim=True))
    scale = q.shape[-1] ** -0.5
    terms = q.shape[-1] + case.n + 2  # dP's and delta's dot products, then the sum over keys
    return (summation_bound(size @ k64.abs() * scale, terms, torch.float32),
            summation_bound(size.transpose(-2, -1) @ q64.abs() * scale, terms, torch.float32))


def _backward_case(flash_attention_backward, case: AttnCase, seed: int) -> None:
    what, (dq, dk, dv), exact, same, rule = _backward_grads(flash_attention_backward, case, seed)
    dq_bound, dk_bound = _cancellation_bounds(case, seed) if case.dtype == torch.float32 else (None, None)
    failed = _close(dk, exact[1], same[1], f"{what}, dk", **rule, bound=dk_bound)
    if failed:
        if _close(dv, exact[2], same[2], f"{what}, dv", **rule) is None:
            raise CheckFailed(f"{failed}; dv is right here, so P and its masks are: look at dS = P ⊙ (dP - "
                              "delta) with dP = dO Vᵀ in _dkdv_from, and at dk's final multiplication by scale")
        raise CheckFailed(f"{failed}; dv is wrong here too: fix what the flash_backward_dv check reports first")
    failed = _close(dq, exact[0], same[0], f"{what}, dq", **rule, bound=dq_bound)
    if failed:
        raise CheckFailed(f"{failed}; dk is right here, so delta and dS are: look at flash_dq_kernel and _dq_from "
                          "(the key blocks each query block visits, their masks, dq's multiplication by scale) "
                          "and at dq's launch")


def check_flash_backward(flash_attention_backward, cases: str = "visible") -> None:
    """Step 3 of exercise 4: dk, then dq (dv is step 2's), and the memory of the whole backward."""
    for seed, case in enumerate(_attn_plan(cases)):
        _backward_case(flash_attention_backward, case, seed)
    _grade_drawn_flash("flash_backward", cases,
                       lambda case, seed: _backward_case(flash_attention_backward, case, seed))
    for i, case in enumerate(_mem_plan(cases)):
        (b, h, d), n = _MEM_BHD, case.seq
        q, k, v = _qkv(b, h, n, d, case.dtype, 31 + i)
        do = _randn((b, h, n, d), case.dtype, 32 + i)
        exact_o, exact_lse = _exact(q, k, v, case.causal)
        o, lse = exact_o.to(case.dtype), exact_lse.float()
        del exact_o, exact_lse
        what = (f"flash_attention_backward(B={b}, H={h}, N={n}, d={d}, {'causal' if case.causal else 'not causal'}, "
                f"{_name(case.dtype)})")
        with _given_delta(flash_attention_backward):
            grads, report = measure_peak(
                lambda: call_learner(flash_attention_backward, do, q, k, v, o, lse, case.causal, what=what),
                device=memfit.DEVICE)
        budget = math.ceil(1.05 * (3 * q.numel() * q.element_size() + b * h * n * 4))
        if report.peak_bytes > budget:
            raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds dq, dk, dv "
                              f"and one fp32 delta per row ({format_bytes(budget)} with 5%): recompute P in the "
                              "kernels, compute delta = rowsum(do * o) in a kernel too, and write the gradients in "
                              "q's dtype from the kernels")
        _check_kept(report, 0, what, "dq, dk and dv")
        del grads
        if report.ops is None or report.meter != LIVE_TENSORS:
            with _given_delta(flash_attention_backward):
                _, report = measure_peak(
                    lambda: call_learner(flash_attention_backward, do, q, k, v, o, lse, case.causal, what=what),
                    device=memfit.DEVICE, meter=LIVE_TENSORS, warmup=False)
        expect_no_torch_arithmetic(report.ops, what, "delta and the gradients belong in your Triton kernels")


# ------------------------------------------------------------------------ autograd: numerics and memory

@dataclass(frozen=True)
class AutogradCase:
    """Forward + backward through flash_attention: (B, N, H, d) projections viewed as (B, H, N, d), or not."""
    b: int
    n: int
    h: int
    d: int
    causal: bool
    slot: int
    layout: str
    hidden: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return _dtype(self.slot)

    def axes(self) -> dict:
        return {"dtype": _name(self.dtype), "causal": self.causal, "layout": self.layout}


AUTOGRAD_CASES = [AutogradCase(1, 40, 2, 32, True, 0, "transposed"), AutogradCase(1, 24, 1, 16, False, 1, "transposed"),
                  AutogradCase(1, 20, 2, 32, False, 2, "contiguous"), AutogradCase(2, 9, 1, 64, True, 1, "contiguous"),
                  AutogradCase(2, 70, 3, 64, False, 1, "transposed", True),
                  AutogradCase(1, 50, 2, 80, True, 0, "transposed", True),
                  AutogradCase(1, 33, 2, 16, True, 2, "contiguous", True),
                  AutogradCase(2, 21, 1, 32, False, 0, "contiguous", True)]


def _blame(flash_attention, run_case, exc: CheckFailed):
    """The failure of `run_case(flash_attention)`, with the cell at fault named where the course's flash_delta,
    backward or forward in place of the learner's makes the case pass (flash_attention itself is given code)."""
    if isinstance(exc, NotImplementedYet):  # flash_attention is given: the stub is one of the functions it calls
        return NotImplementedYet("flash_attention (given) calls your flash_attention_forward and "
                                 "flash_attention_backward (which calls flash_delta), and one of them is not "
                                 "implemented yet: finish exercises 3 and 4 first")
    for name in ("flash_delta", "flash_attention_backward", "flash_attention_forward"):
        with given_references(flash_attention, **{name: getattr(REFERENCE, name)}) as swap:
            if not swap.replacements:
                continue
            try:
                run_case(flash_attention)
            except Exception:  # noqa: BLE001  (still failing: not this cell alone)
                continue
        return CheckFailed(f"{exc} (with the course's {name} in place of yours this case passes: the bug is in "
                           f"{_WHERE[name]})")
    return exc


_WHERE = {"flash_delta": "your flash_delta cell", "flash_attention_forward": "your flash_attention_forward cell",
          "flash_attention_backward": "exercise 4's cells (flash_delta, the dK/dV kernel or the dQ kernel: the "
                                      "checks flash_delta, flash_backward_dv and flash_backward say which)"}


def _autograd_numerics(flash_attention, case: AutogradCase, seed: int) -> None:
    b, n, h, d = case.b, case.n, case.h, case.d
    layout = case.layout
    q, k, v = (_in_layout(_randn((b, h, n, d), case.dtype, 40 + 3 * seed + i), layout) for i in range(3))
    do = _in_layout(_randn((b, h, n, d), case.dtype, 50 + seed), layout)  # the gradient arrives in the same layout
    what = (f"flash_attention(B={b}, H={h}, N={n}, d={d}, {'causal' if case.causal else 'not causal'}, "
            f"{_name(case.dtype)}) on " + ("transposed (B, N, H, d) inputs and dO" if layout == "transposed"
                                           else "contiguous inputs"))
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = call_learner(flash_attention, *leaves, case.causal, what=what)
    exact_o, _ = _exact(q, k, v, case.causal)
    assert_close_by_rule(out, exact_o, F.scaled_dot_product_attention(q, k, v, is_causal=case.causal), what + ", o",
                         bound=_bounds(q, k, v, case.causal)[0])
    call_learner(out.backward, do, what=what + ", backward")
    exact, same = _exact_and_same_grads(q, k, v, do, case.causal)
    for name, leaf, e, s in zip(("q.grad", "k.grad", "v.grad"), leaves, exact, same):
        assert_close_by_rule(leaf.grad, e, s, f"{what}, {name}", floor_ulps=_gradient_floor_ulps(case.dtype, n))


def _autograd_memory(flash_attention, case: MemCase, seed: int) -> None:
    """Forward and backward measured apart: forward may keep o (its result) and the lse (4 bytes per query row)
    beyond the inputs; backward may add dq, dk, dv and delta, and leave only the gradients."""
    b, h, n, d = (1, 16, 2 * case.seq, 64) if memfit.HAS_GPU else (1, 2, 2 * case.seq, 32)
    transposed = case.layout == "transposed"
    # the leaves: (B, H, N, d) tensors, or (B, N, H, d) ones whose (B, H, N, d) views flash_attention is given
    leaves = [_randn((b, n, h, d) if transposed else (b, h, n, d), case.dtype, 60 + seed + i).requires_grad_(True)
              for i in range(3)]
    q, k, v = (t.transpose(1, 2) if transposed else t for t in leaves)
    do = _randn((b, h, n, d), case.dtype, 63 + seed)
    what = (f"flash_attention(B={b}, H={h}, N={n}, d={d}, {'causal' if case.causal else 'not causal'}, "
            f"{_name(case.dtype)}{', q, k, v transposed (B, N, H, d) views' if transposed else ''})")
    tensor, rows = q.numel() * q.element_size(), b * h * n * 4
    copies = 3 * tensor if transposed else 0  # the given heads_contiguous copies q, k, v for the kernels
    out, report = measure_peak(lambda: call_learner(flash_attention, q, k, v, case.causal, what=what + " forward"),
                               device=memfit.DEVICE, warmup=False)
    budget = math.ceil(1.05 * (tensor + rows + copies))
    if report.peak_bytes > budget:
        raise CheckFailed(f"{what} forward: peak extra memory {format_bytes(report.peak_bytes)} exceeds o and lse "
                          f"({format_bytes(budget)} with 5%); naive attention would keep "
                          f"{format_bytes(b * h * n * n * q.element_size())} for P alone: no N x N tensor, and no "
                          "copies of q, k, v or o in forward")
    if report.kept_bytes > rows + KEPT_SLACK:
        raise CheckFailed(f"{what} forward: {format_bytes(report.kept_bytes)} saved for backward beyond q, k, v and o "
                          f"(allowed: the lse, {format_bytes(rows)}): save q, k, v, o and lse as they are, no "
                          "converted copies")

    def backward():
        call_learner(out.backward, do, what=what + " backward")
        return tuple(t.grad for t in leaves)

    _, report = measure_peak(backward, device=memfit.DEVICE, warmup=False)
    budget = math.ceil(1.05 * (3 * tensor + rows + copies))
    if report.peak_bytes > budget:
        raise CheckFailed(
            f"{what} backward: peak extra memory {format_bytes(report.peak_bytes)} exceeds dq, dk, dv and delta "
            f"({format_bytes(budget)} with 5%); naive attention would keep {format_bytes(b * h * n * n * q.element_size())} "
            "for P alone: recompute P tile by tile in the kernels, from q, k, v, o and lse")
    _check_kept(report, 0, what + " backward", "q.grad, k.grad and v.grad")
    if report.meter != LIVE_TENSORS:  # on a GPU: once more, forward + backward, under the live-tensor meter
        for t in leaves:
            t.grad = None
        out = call_learner(flash_attention, q, k, v, case.causal, what=what + " forward")
        _, report = measure_peak(backward, device=memfit.DEVICE, warmup=False, meter=LIVE_TENSORS)
    expect_no_torch_arithmetic(report.ops, what + " backward", "delta and the gradients belong in your Triton kernels")


def check_flash_attention_memory(flash_attention, cases: str = "visible") -> None:
    runs = [functools.partial(_autograd_numerics, case=case, seed=seed)
            for seed, case in enumerate(c for c in _plan(AUTOGRAD_CASES, cases) if _slot_exists(c.slot))]
    runs += [functools.partial(_autograd_memory, case=case, seed=seed) for seed, case in enumerate(_mem_plan(cases))]
    if check_cases(cases)[1]:
        runs.append(lambda fn: grade_drawn(memory_domain(), "flash_attention_memory", DRAWN_MEMORY_CASES,
                                           lambda d: _autograd_memory(fn, _drawn_mem_case(d), d["seed"] % 1000)))
    for run in runs:
        try:
            run(flash_attention)
        except CheckFailed as exc:
            raise _blame(flash_attention, run, exc) from None


# On a GPU the first grading run compiles every kernel variant the cases need (a few seconds each, minutes
# in all on a 2-core Colab machine); later runs load them from Triton's cache. Hence the long timeouts.
CHECKS = [
    Check("online_softmax", 2, check_online_softmax, uses=("online_softmax_stats",)),
    Check("attention_tiled", 3, check_attention_tiled, uses=("attention_tiled",)),
    Check("flash_forward", 3, check_flash_forward, uses=("flash_attention_forward",), timeout_s=600),
    Check("flash_forward_memory", 1, check_flash_forward_memory, uses=("flash_attention_forward",)),
    # exercise 4 in its three steps: delta alone, dv alone, then dk and dq with the whole backward's memory
    Check("flash_delta", 1, check_flash_delta, uses=("flash_delta",), timeout_s=600),
    Check("flash_backward_dv", 1, check_flash_backward_dv, uses=("flash_attention_backward",), timeout_s=600),
    Check("flash_backward", 2, check_flash_backward, uses=("flash_attention_backward",), timeout_s=600),
    Check("flash_attention_memory", 2, check_flash_attention_memory, uses=("flash_attention",), timeout_s=600),
]


# ------------------------------------------------------------------------------------------------ axes

def _names(values) -> tuple:
    return tuple(_name(v) for v in values)


_SHAPE_AXES = {"causal": (False, True), "layout": ("contiguous", "transposed"),
               "N": ("1", "not a multiple of 16", "a multiple of 32"),
               "head_dim": ("a power of two <= 64", "128", "not a power of two (BLOCK_D > d)"),
               "batch x heads": ("1", "several"), "logits": ("moderate", "large")}
_TILE_AXES = {"kernel tiles": ("this machine's", "the interpreter's (BLOCK_M != BLOCK_N)")}
_MEM_AXES = {"memory dtype": None, "memory causal": (False, True), "memory layout": ("contiguous", "transposed")}
_DO_AXES = {"dO": ("random", "aligned with o (large delta)")}


def _axes() -> dict:
    dtypes = {"dtype": _names(_dtypes())}
    mem = {**_MEM_AXES, "memory dtype": _names(_dtypes())}
    return {
        "online_softmax": {**dtypes, "blocks": ("one", "several", "width 1", "uneven widths"),
                           "rows": ("one", "several"), "values": ("moderate", "large positive", "large negative"),
                           "-inf entries": ("none", "first", "scattered")},
        "attention_tiled": {**dtypes, **_SHAPE_AXES, **mem,
                            "tiles": ("block_m = block_n", "block_m > block_n", "block_m < block_n", "defaults")},
        "flash_forward": {**dtypes, **_SHAPE_AXES, **_TILE_AXES, "invalid input": ("length", "dtype", "head_dim")},
        "flash_forward_memory": mem,
        "flash_delta": {**dtypes, **{a: _SHAPE_AXES[a] for a in ("layout", "N", "head_dim", "batch x heads")},
                        **_DO_AXES, "memory dtype": mem["memory dtype"]},  # no mask: delta has no causal
        "flash_backward_dv": {**dtypes, **_SHAPE_AXES, **_TILE_AXES, **_DO_AXES},
        "flash_backward": {**dtypes, **_SHAPE_AXES, **_TILE_AXES, **mem, **_DO_AXES},
        "flash_attention_memory": {**dtypes, "causal": (False, True), "layout": ("contiguous", "transposed"), **mem},
    }


AXES = _axes()


def case_axes(check: str, cases: str) -> list[dict]:
    """The cases `check` runs under `cases` ("visible" or "hidden"), each as {axis: value}: read from the same
    records the check iterates over."""
    mem = [c.axes() for c in _mem_plan(cases)]
    if check == "online_softmax":
        return [c.axes() for c in _plan(SOFTMAX_CASES, cases)]
    if check == "attention_tiled":
        return [c.axes(check) for c in _attn_plan(cases, max_n=1000)] + mem
    if check == "flash_forward":
        return [c.axes(check) for c in _attn_plan(cases)] + [c.axes() for c in _plan(INVALID_CASES, cases)]
    if check == "flash_forward_memory":
        return mem
    if check == "flash_delta":
        return [c.axes(check) for c in _attn_plan(cases)] + [{"memory dtype": m["memory dtype"]} for m in mem]
    if check == "flash_backward":
        return [c.axes(check) for c in _attn_plan(cases)] + mem
    if check == "flash_backward_dv":
        return [c.axes(check) for c in _attn_plan(cases)]
    if check == "flash_attention_memory":
        return [c.axes() for c in _plan(AUTOGRAD_CASES, cases) if _slot_exists(c.slot)] + mem
    raise KeyError(check)


_FORWARD = {"q_ptr": "*{dtype}", "k_ptr": "*{dtype}", "v_ptr": "*{dtype}", "o_ptr": "*{dtype}", "lse_ptr": "*fp32",
            "n": "i32", "d": "i32", "qk_scale": "fp32"}
_BACKWARD = {"q_ptr": "*{dtype}", "k_ptr": "*{dtype}", "v_ptr": "*{dtype}", "do_ptr": "*{dtype}", "lse_ptr": "*fp32",
             "delta_ptr": "*fp32"}
# Compiled at each head-dim class's largest head dim, causal (both loops of each kernel), fp16 and fp32.
KERNELS = [
    spec
    for variant, d in (("d64", 64), ("d128", 128))
    for spec in (
        KernelSpec("flash_forward_kernel", "flash_forward", _FORWARD, variant=variant,
                   constexprs=dict(CAUSAL=True, BLOCK_D=d)),
        KernelSpec("flash_dkdv_kernel", "flash_dkdv",
                   {**_BACKWARD, "dk_ptr": "*{dtype}", "dv_ptr": "*{dtype}", "n": "i32", "d": "i32",
                    "sm_scale": "fp32"},
                   variant=variant, constexprs=dict(CAUSAL=True, BLOCK_D=d)),
        KernelSpec("flash_dq_kernel", "flash_dq",
                   {**_BACKWARD, "dq_ptr": "*{dtype}", "n": "i32", "d": "i32", "sm_scale": "fp32"},
                   variant=variant, constexprs=dict(CAUSAL=True, BLOCK_D=d)),
    )
]
