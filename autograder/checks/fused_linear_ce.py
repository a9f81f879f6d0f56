"""Checks of lesson 06 (solutions/06_fused_linear_ce.ipynb): cross-entropy with its gradient in one pass, the
linear layer + cross-entropy chunked over tokens, the Triton version in tiles, and the autograd Function.

Each check iterates over case records (CE_CASES, CHUNK_CASES, TILE_CASES, ...; each record visible or hidden);
AXES lists what each exercise's text lets vary and case_axes reads the same records. Numerics follow the course's
rule (autograder/checks/numerics.py): loss, dX, dW and db against a float64 reference (F.linear + F.cross_entropy
through autograd), at most 2x the error of PyTorch's same chain in the input's dtype, plus a floor relative to the
largest entry of each tensor (exercise 1's loss and dlogits: of the weighted terms of lse's size they are differences
of), in every dtype of the profile. Hidden cases are also drawn from exercises 1 and 2's whole domains
(autograder/checks/domain.py). Cases cover ignored tokens (some, all, a whole chunk)
under ignore_index -100, -1 and a vocabulary id, both reductions, label smoothing with ignored tokens, softcapping
(with tiles narrower than a block), a bias, fp32_dw, logits large enough to overflow an exp without the row's
maximum, token counts and vocabularies that are not a multiple of the chunk, the tile or the block. Inputs must
be left unchanged and results must not alias them; tensors the Triton exercises allocate carry guard regions.
Exercise 2 runs with the reference cross_entropy_with_grad and exercise 4 with the reference
fused_linear_ce_forward, so a bug costs the points of its own exercise only. Memory, with the live-tensor meter
on every call path (chunk_size / chunks given and None, fp32_dw, each dtype): no tensor of tokens x vocabulary
elements, a peak within the gradients plus the scratch the plan needs, nothing kept after the call.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import memfit
from memfit.from_lessons import fused_linear_ce as reference  # imported before the grading child's guards go up
from autograder.checks import (Check, CheckFailed, KernelSpec, call_learner, check_cases, select, expect_value_error,
                               given_references)
from autograder.checks.domain import Choice, Sizes, grade_drawn
from autograder.checks.numerics import (assert_close_by_rule, call_pure, expect_like, guarded_allocations,
                                        training_half, seeded_generator)
from autograder.checks.numerics import dtype_name as _name, seeded_randn as _randn
from memfit.hardware import config as _config
from memfit.meter import LIVE_TENSORS, LiveTensorMeter, format_bytes, measure_peak

DTYPES = tuple(memfit.profile().dtypes)
DTYPE_NAMES = tuple(_name(d) for d in DTYPES)
KEPT_ALLOWED = 512  # bytes a call may leave allocated beyond its result (none, give or take an odd scalar)


class Case:
    """One problem: n tokens, hidden h, vocabulary v; which tokens are ignored; the loss's options; the record's
    dtype ("cycle": the profile's dtypes in turn, "half": the 16-bit training dtype, or a dtype's name) and
    whether it is hidden."""

    def __init__(self, n, h, v, ignored=0.0, smoothing=0.0, softcap=None, bias=False, reduction="mean",
                 chunk=None, ignore_first=0, ignore_index=-100, fp32_dw=False, magnitude="ordinary",
                 dtype="cycle", hidden=False, chunks=None, lead=None, g=1.0, layout="contiguous", repeated=False):
        self.n, self.h, self.v, self.ignored, self.smoothing = n, h, v, ignored, smoothing
        self.softcap, self.bias, self.reduction = softcap, bias, reduction
        self.chunk, self.ignore_first, self.ignore_index = chunk, ignore_first, ignore_index
        self.fp32_dw, self.magnitude, self.dtype, self.hidden = fp32_dw, magnitude, dtype, hidden
        self.chunks, self.lead, self.g, self.layout = chunks, lead or (n,), g, layout
        # repeated: every token the same row of x and the same target, so every row chunk adds the same dW: summed in
        # a 16-bit dtype, the chunks' products drift by many units in the last place (fp32_dw=True must not)
        self.repeated = repeated

    def dtype_at(self, index: int) -> torch.dtype:
        if self.dtype == "half":
            return training_half()
        if self.dtype == "cycle":
            return DTYPES[index % len(DTYPES)]
        return getattr(torch, self.dtype)  # a dtype's name: "float32", "float16", "bfloat16"

    def describe(self, dtype) -> str:
        parts = [f"N={self.n}, H={self.h}, V={self.v}", _name(dtype), self.reduction]
        if self.ignored == 1.0:
            parts.append("every token ignored")
        elif self.ignored:
            parts.append(f"{self.ignored:.0%} of tokens ignored")
        if self.ignore_first:
            parts.append(f"the first {self.ignore_first} tokens ignored")
        if self.ignore_index != -100:
            parts.append(f"ignore_index={self.ignore_index}")
        if self.bias:
            parts.append("bias")
        if self.smoothing:
            parts.append(f"label_smoothing={self.smoothing}")
        if self.softcap:
            parts.append(f"softcap={self.softcap}")
        if self.fp32_dw:
            parts.append("fp32_dw=True")
        if self.magnitude == "large":
            parts.append("logits around +100")
        return ", ".join(parts)

    def targets(self, seed):
        gen = seeded_generator(seed + 3)
        t = torch.randint(0, self.v, (self.n,), generator=gen)
        t[torch.rand(self.n, generator=gen) < self.ignored] = self.ignore_index
        t[: self.ignore_first] = self.ignore_index
        return t.to(memfit.DEVICE)

    def inputs(self, dtype, seed):
        x = _randn((self.n, self.h), dtype, seed)
        w = _randn((self.v, self.h), dtype, seed + 1, scale=2.0 / math.sqrt(self.h))
        b = _randn((self.v,), dtype, seed + 2, scale=0.5) if self.bias else None
        t = self.targets(seed)
        if self.repeated:
            x, t = x[:1].repeat(self.n, 1), torch.full_like(t, int(t[0]) if int(t[0]) >= 0 else 0)
        return x, w, t, b

    def options(self, fp32_dw=False):
        options = dict(ignore_index=self.ignore_index, reduction=self.reduction, label_smoothing=self.smoothing,
                       softcap=self.softcap)
        if fp32_dw:
            options["fp32_dw"] = self.fp32_dw
        return options

    def all_ignored(self, t) -> bool:
        return bool((t == self.ignore_index).all())

    def axes(self, dtype, chunk_rows=None) -> dict:
        ignored = "all" if self.ignored == 1.0 else "some" if (self.ignored or self.ignore_first) else "none"
        axes = {"dtype": _name(dtype), "reduction": self.reduction, "ignore_index": self.ignore_index,
                "ignored": ignored, "label_smoothing": "on" if self.smoothing else "off",
                "softcap": "on" if self.softcap else "off"}
        if ignored == "some" and self.smoothing:
            axes["ignored"] = ("some", "some, with label smoothing")
        if chunk_rows and self.ignore_first >= chunk_rows:
            axes["ignored"] = values(axes["ignored"]) + ("a whole chunk",)
        return axes


def values(v) -> tuple:
    return tuple(v) if isinstance(v, tuple) else (v,)


def _plan(records, cases: str):
    """[(index, record, dtype)] of the records `cases` selects; dtypes cycle within the visible and hidden sets."""
    visible, hidden = check_cases(cases)
    out = []
    for part in ("visible",) * visible + ("hidden",) * hidden:
        out += [(i, r, r.dtype_at(i)) for i, r in enumerate(select(records, part))]
    return out


def _chain(x, w, t, b, case, logits_only=False):
    logits = F.linear(x, w, b)
    if case.softcap:
        logits = case.softcap * torch.tanh(logits / case.softcap)
    if logits_only:
        return logits
    return _loss(logits, t, case)


def _loss(logits, t, case):
    if case.all_ignored(t) and case.reduction == "mean":
        return logits.sum() * 0  # the mean over no token: defined as 0 (PyTorch would give NaN)
    return F.cross_entropy(logits, t, ignore_index=case.ignore_index, reduction=case.reduction,
                           label_smoothing=case.smoothing)


def _grads(x, w, t, b, case, cast):
    """(loss, dx, dw, db) of PyTorch's chain on cast(inputs), by autograd."""
    leaves = [None if a is None else cast(a).detach().clone().requires_grad_(True) for a in (x, w, b)]
    loss = _chain(leaves[0], leaves[1], t, leaves[2], case)
    loss.backward()
    return (loss.detach(), *[None if a is None else a.grad for a in leaves])


def _references(x, w, t, b, case):
    return _grads(x, w, t, b, case, torch.Tensor.double), _grads(x, w, t, b, case, lambda a: a)


def _rounding_bounds(x, w, t, b, case, exact) -> list:
    """Per element of (loss, dx, dw, db), for fp32 cases: a first-order bound on the rounding of any right fp32 kernel.
    Each dlogit (p - y, times the softcap's 1 - tanh^2, times the row's weight) is off by a few units of roundoff of
    |p - y| (the softcap's derivative cancels near saturation), of p (|lse| + |z| + 2) (p = exp(z - lse) with lse and z
    in fp32) and of p times the logit's own rounding ((H + 2) |x|.|w|); the matmuls add (terms + 2) units of their
    |products|. PyTorch's error on one case can be far below this where few elements take part, so the rule alone
    (2 x PyTorch's error) once failed a right kernel. None for 16-bit cases (the rule is wide enough there)."""
    if x.dtype != torch.float32:
        return [None] * len(exact)
    u = torch.finfo(torch.float32).eps / 2
    x64, w64 = x.double().reshape(-1, x.shape[-1]), w.double()
    logits = F.linear(x64, w64, None if b is None else b.double())
    z = case.softcap * torch.tanh(logits / case.softcap) if case.softcap else logits
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    p = torch.exp(z - lse)
    tt = t.reshape(-1)
    valid = (tt != case.ignore_index).double().unsqueeze(-1)
    y = torch.full_like(p, case.smoothing / case.v)
    y.scatter_add_(1, tt.clamp(0, case.v - 1).unsqueeze(-1).to(y.device),
                   torch.full_like(p[:, :1], 1.0 - case.smoothing))
    weight = valid / max(1.0, valid.sum().item()) if case.reduction == "mean" else valid
    dlogits = (p - y) * weight
    logit_error = (case.h + 2) * (x64.abs() @ w64.abs().t())
    e = 4 * u * weight * ((p - y).abs() + p * (lse.abs() + z.abs() + 2 + logit_error))
    dl = dlogits.abs()
    dx = e @ w64.abs() + (case.v + 2) * u * (dl @ w64.abs())
    dw = e.t() @ x64.abs() + (dl.shape[0] + 2) * u * (dl.t() @ x64.abs())
    db = e.sum(0) + (dl.shape[0] + 2) * u * dl.sum(0)
    return [None, dx.flatten(), dw.flatten(), db.flatten() if case.bias else None]


def _power_of_two_scale(exact: torch.Tensor) -> float:
    """2^k bringing the largest |entry| into [0.5, 1): the rule's floor becomes relative to this tensor, and
    multiplying by a power of two is exact."""
    peak = exact.abs().max().item() if exact.numel() else 0.0
    return 1.0 if peak == 0 or not math.isfinite(peak) else 2.0 ** -math.ceil(math.log2(peak))


def _close(got, exact, same, what, floor_ulps, relative_scale: float = 1.0, bound=None):
    """relative_scale: the floor in units of the largest |exact| (a result known only to more than a few ulps);
    bound: a per-element tolerance every right kernel meets (_rounding_bounds)."""
    expect_like(got, same, what)
    k = _power_of_two_scale(exact)
    assert_close_by_rule(got * k, exact * k, same * k, what, floor_ulps=floor_ulps, scale=relative_scale,
                         bound=None if bound is None else bound * k)


def _softmax_scale(logits, dtype, floor_ulps) -> float:
    """p = exp(x - lse), with lse = m + log(sum) held in fp32, is known to about half an ulp of lse relative to p:
    at logits near 100 that is 2^6 fp32 ulps (a GPU's exp adds a few more), more than PyTorch's softmax, which
    never forms lse, loses. The floor in units of max |p|: 1 plus that ulp in floor_ulps of the result's dtype."""
    peak = logits.detach().abs().max().float().item() if logits.numel() else 0.0
    lse_ulp = torch.finfo(torch.float32).eps * 2.0 ** math.floor(math.log2(max(peak, 1.0)))
    return 1.0 + lse_ulp / (floor_ulps * torch.finfo(dtype).eps)


def _floor(dtype, terms: int) -> float:
    """fp32: orders of summation differ by about sqrt(terms) ulps; fp16/bf16: a few roundings (dW sums up to
    four chunk products in the weight's dtype)."""
    return 8 * math.sqrt(terms) if dtype == torch.float32 else 4.0


def _loss_floor(dtype, terms: int) -> float:
    """In fp32 ulps (the loss is fp32): logits rounded to a low-precision dtype move the loss by a fraction of
    that dtype's ulp, which PyTorch's own loss can happen to avoid on a given case."""
    return _floor(dtype, terms) * torch.finfo(dtype).eps / torch.finfo(torch.float32).eps


def _compare(got, x, w, t, b, case, dtype, what):
    """got = (loss, dx, dw, db) against the float64 chain and PyTorch's same-dtype chain."""
    if not (isinstance(got, tuple) and len(got) == 4):
        raise CheckFailed(f"{what} should return (loss, dx, dw, db), got {type(got).__name__}")
    exact, same = _references(x, w, t, b, case)
    bounds = _rounding_bounds(x, w, t, b, case, exact)
    loss = got[0]
    if not isinstance(loss, torch.Tensor) or loss.dtype != torch.float32 or loss.dim() != 0:
        raise CheckFailed(f"{what}: the loss should be a 0-dim fp32 tensor, got "
                          f"{getattr(loss, 'dtype', type(loss).__name__)} of shape {tuple(getattr(loss, 'shape', ()))}")
    same_loss = same[0].float() if torch.isfinite(same[0]) else exact[0].float()
    _close(loss, exact[0], same_loss, what + ", loss", _loss_floor(dtype, case.v), bound=bounds[0])
    _close(got[1], exact[1], same[1], what + ", dx", _floor(dtype, case.v), bound=bounds[1])
    # One row repeated: every chunk adds the same product, so an fp32 sum of them rounds only each product and the
    # final cast (2 units in the last place); a 16-bit sum drifts a unit per chunk or so.
    dw_floor = 2.0 if case.repeated and dtype != torch.float32 else _floor(dtype, case.n)
    _close(got[2], exact[2], same[2], what + ", dw", dw_floor, bound=bounds[2])
    if case.bias:
        _close(got[3], exact[3], same[3], what + ", db", _floor(dtype, case.n), bound=bounds[3])
    elif got[3] is not None:
        raise CheckFailed(f"{what}: without a bias, db should be None")


def _kept(report, what, allowed=KEPT_ALLOWED, besides: str = "its result"):
    if report.kept_bytes > allowed:
        raise CheckFailed(f"{what}: {format_bytes(report.kept_bytes)} stayed allocated after the call returned, "
                          f"beyond {besides}: a scratch kept in a global or a cache outlives the call; allocate it "
                          "inside the call and let it go")


# -------------------------------------------------------------------------- exercise 1: loss and dlogits

CE_CASES = [
    Case(8, 0, 50),
    Case(33, 0, 1000, ignored=0.3),
    Case(16, 0, 300, reduction="sum", smoothing=0.1, ignored=0.3, ignore_index=-1),
    Case(10, 0, 200, ignored=1.0),
    Case(12, 0, 64, softcap=5.0, smoothing=0.1, ignored=0.25, ignore_index=0),
    Case(9, 0, 77, magnitude="large", reduction="sum", ignored=0.2),
    Case(40, 0, 513, softcap=5.0, ignored=0.2, hidden=True),
    Case(7, 0, 2049, smoothing=0.2, ignored=0.5, ignore_index=-1, hidden=True),
    Case(64, 0, 100, reduction="sum", softcap=3.0, smoothing=0.05, hidden=True),
    Case(20, 0, 300, magnitude="large", ignored=0.3, ignore_index=0, hidden=True),
    Case(6, 0, 90, ignored=1.0, reduction="sum", ignore_index=-1, hidden=True),
    Case(25, 0, 129, magnitude="large", smoothing=0.1, ignored=0.2, hidden=True),
]


def _logits(case, dtype, seed):
    scale = 8.0 if case.softcap else 3.0  # peaked rows; softcap cases reach the cap's curved part
    logits = _randn((case.n, case.v), dtype, seed, scale=scale)
    return logits + 100 if case.magnitude == "large" else logits  # exp(100) overflows fp32


def _check_ce_case(cross_entropy_with_grad, case, dtype, seed) -> None:
    logits = _logits(case, dtype, seed)
    t = case.targets(seed)
    what = f"cross_entropy_with_grad({case.describe(dtype).replace(', H=0', '')})"
    got = call_pure(cross_entropy_with_grad, logits, t, **case.options(), what=what)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise CheckFailed(f"{what} should return (loss, dlogits), got {type(got).__name__}")
    results = {}
    for key, cast in (("exact", torch.Tensor.double), ("same", lambda a: a)):
        leaf = cast(logits).detach().clone().requires_grad_(True)
        capped = case.softcap * torch.tanh(leaf / case.softcap) if case.softcap else leaf
        loss = _loss(capped, t, case)
        loss.backward()
        results[key] = (loss.detach(), leaf.grad)
    loss, dlogits = got
    if not isinstance(loss, torch.Tensor) or loss.dtype != torch.float32 or loss.dim() != 0:
        raise CheckFailed(f"{what}: the loss should be a 0-dim fp32 tensor, got "
                          f"{getattr(loss, 'dtype', type(loss).__name__)}")
    valid = int((t != case.ignore_index).sum())
    row = 1.0 / max(valid, 1) if case.reduction == "mean" else 1.0  # the weight of each counted row
    lf, floor = _loss_floor(dtype, case.v), _floor(dtype, 1)
    _close(loss, results["exact"][0], results["same"][0].float(), what + ", loss", lf,
           _lse_terms(results["exact"][0], row * valid, logits, torch.float32, lf))
    _close(dlogits, results["exact"][1], results["same"][1], what + ", dlogits", floor,
           _lse_terms(results["exact"][1], row if valid else 0.0, logits, dtype, floor))


def _lse_terms(exact, weight: float, logits, dtype, floor_ulps) -> float:
    """_close's relative_scale for the loss (weight: the rows' weights summed) and dlogits (one row's weight): both
    are differences of terms of lse's size times the weight, known to lse's ulp (_softmax_scale), so a loss near 0 or
    dlogits where p and the one-hot cancel (few words, confident rows) are not held to ulps of themselves."""
    return max(1.0, _power_of_two_scale(exact) * weight) * _softmax_scale(logits, dtype, floor_ulps)


# Exercise 1's and 2's loss options over the whole of what the text allows: ignore_index any integer (-100, -1, a
# padding id inside the vocabulary: 0 or V-1), some or every token ignored, label_smoothing in [0, 1), a softcap.
def _loss_axes() -> dict:
    return {"dtype": Choice(*DTYPE_NAMES), "reduction": Choice("mean", "sum"),
            "ignore_index": Choice(-100, -1, 0, "V-1"), "ignored": Choice("none", "some", "all"),
            "label_smoothing": Choice(0.0, 0.1, 0.6), "softcap": Choice(None, 5.0, 1.0)}


def _drawn_loss_case(d: dict, h: int, **more) -> Case:
    ignore_index = d["v"] - 1 if d["ignore_index"] == "V-1" else d["ignore_index"]
    ignored = {"none": 0.0, "some": 0.3, "all": 1.0, "a whole chunk": 0.2}[d["ignored"]]
    return Case(d["n"], h, d["v"], ignored=ignored, smoothing=d["label_smoothing"], softcap=d["softcap"],
                reduction=d["reduction"], ignore_index=ignore_index, dtype=d["dtype"], hidden=True, **more)


def ce_domain() -> dict:
    """Every call exercise 1's text allows (vocabularies around the kernels' block too; autograder/checks/domain.py
    draws hidden cases from it)."""
    return {"n": Sizes(1, 80, edges=(1, 2)), "v": Sizes(1, max(2100, BLOCK + 1), edges=(1, 2, BLOCK - 1, BLOCK, BLOCK + 1)),
            **_loss_axes(), "magnitude": Choice("ordinary", "large")}


DRAWN_CE_CASES = 2


def check_cross_entropy_with_grad(cross_entropy_with_grad, cases: str = "visible") -> None:
    for index, case, dtype in _plan(CE_CASES, cases):
        _check_ce_case(cross_entropy_with_grad, case, dtype, 100 + index + (50 if case.hidden else 0))
    if check_cases(cases)[1]:
        def check_one(d: dict) -> None:
            case = _drawn_loss_case(d, 0, magnitude=d["magnitude"])
            _check_ce_case(cross_entropy_with_grad, case, case.dtype_at(0), d["seed"])
        grade_drawn(ce_domain(), "cross_entropy_with_grad", DRAWN_CE_CASES, check_one)


# ------------------------------------------------------------------------ exercise 2: chunks of tokens

CHUNK_CASES = [
    Case(40, 16, 300, ignored=0.2, chunk=16),
    Case(64, 32, 1000, chunk=None),
    Case(37, 16, 257, ignore_first=16, ignored=0.2, smoothing=0.1, ignore_index=-1, chunk=16),
    Case(12, 8, 100, ignored=1.0, chunk=8),
    Case(24, 8, 120, bias=True, softcap=4.0, reduction="sum", ignored=0.2, ignore_index=0, chunk=8),
    Case(50, 24, 513, bias=True, smoothing=0.1, chunk=16, ignored=0.3, hidden=True),
    Case(30, 16, 700, softcap=4.0, reduction="sum", chunk=8, ignored=0.1, ignore_index=-1, hidden=True),
    Case(33, 16, 128, ignore_first=32, chunk=32, bias=True, ignore_index=0, hidden=True),
    Case(64, 16, 150, chunk=None, ignored=1.0, hidden=True),
    Case(48, 16, 200, chunk=16, smoothing=0.2, hidden=True),
]

# Memory: (tokens, hidden, vocabulary) and chunk_size on both call paths, in every dtype; hidden sizes differ
# (a cache keyed by size would show in the kept bytes of the warm-up call).
# On the default path, shapes where Liger's rule gives 8 rows (a chunk of 7 rows is as right as one of 8).
CHUNK_MEMORY = [Case(128, 32, 3000, ignored=0.1, chunk=16, dtype=d) for d in DTYPE_NAMES] + \
               [Case(128, 64, 1000, ignored=0.1, chunk=None, dtype=d) for d in DTYPE_NAMES] + \
               [Case(96, 48, 900, ignored=0.1, chunk=(None, 16)[i % 2], dtype=d, hidden=True)
                for i, d in enumerate(DTYPE_NAMES)]


def _chunk_message(case) -> str:
    return f"chunk_size={case.chunk}" if case.chunk else "the default chunk size"


def _chunk_fit(case) -> str:
    rows = case.chunk or reference.liger_chunk_size(case.n, case.h, case.v)
    return "divides N" if case.n % rows == 0 else "a partial last chunk"


def _check_chunked_case(chunked_linear_ce, case, dtype, seed) -> None:
    x, w, t, b = case.inputs(dtype, seed)
    what = f"chunked_linear_ce({case.describe(dtype)}, {_chunk_message(case)})"
    got = call_pure(chunked_linear_ce, x, w, t, b, **case.options(), chunk_size=case.chunk, what=what)
    _compare(got, x, w, t, b, case, dtype, what)


def chunk_domain() -> dict:
    """Every call exercise 2's text allows: token counts around the chunk (given, or None: Liger's rule), a whole
    chunk of ignored tokens (the trap), a bias, hidden sizes and vocabularies around the kernels' block."""
    return {"n": Sizes(1, 96, edges=(1, 7, 8, 9, 15, 16, 17)), "h": Sizes(1, 48, edges=(1,)),
            "v": Sizes(1, max(600, BLOCK + 1), edges=(1, 2, BLOCK - 1, BLOCK, BLOCK + 1)), "chunk_size": Choice(None, 16, 8, 1, 128),
            "bias": Choice(False, True), **_loss_axes(),
            "ignored": Choice("none", "some", "a whole chunk", "all")}


DRAWN_CHUNK_CASES = 8


def check_chunked_linear_ce(chunked_linear_ce, cases: str = "visible") -> None:
    with given_references(chunked_linear_ce, cross_entropy_with_grad=reference.cross_entropy_with_grad):
        for index, case, dtype in _plan(CHUNK_CASES, cases):
            _check_chunked_case(chunked_linear_ce, case, dtype, 200 + 10 * index + (500 if case.hidden else 0))
        for index, case, dtype in _plan(CHUNK_MEMORY, cases):
            _check_chunked_memory(chunked_linear_ce, case, dtype)
        if check_cases(cases)[1]:
            def check_one(d: dict) -> None:
                rows = d["chunk_size"] or reference.liger_chunk_size(d["n"], d["h"], d["v"])
                first = min(rows, d["n"]) if d["ignored"] == "a whole chunk" else 0
                case = _drawn_loss_case(d, d["h"], bias=d["bias"], chunk=d["chunk_size"], ignore_first=first)
                _check_chunked_case(chunked_linear_ce, case, case.dtype_at(0), d["seed"])
            grade_drawn(chunk_domain(), "chunked_linear_ce", DRAWN_CHUNK_CASES, check_one)


def _check_chunked_memory(chunked_linear_ce, case, dtype):
    x, w, t, _ = case.inputs(dtype, 7)
    what = f"chunked_linear_ce({case.describe(dtype)}, {_chunk_message(case)})"
    _, report = measure_peak(lambda: call_learner(chunked_linear_ce, x, w, t, chunk_size=case.chunk, what=what),
                             device=memfit.DEVICE, meter=LIVE_TENSORS, warmup=False)
    _no_logits_tensor(report, case, dtype, what)
    rows = case.chunk or reference.liger_chunk_size(case.n, case.h, case.v)
    grads = (case.n + case.v) * case.h * x.element_size()
    allowed = grads + 6 * rows * case.v * 4
    if report.peak_bytes > allowed:
        raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds dX + dW "
                          f"({format_bytes(grads)}) plus six fp32 chunks of {rows} rows of logits "
                          f"({format_bytes(allowed - grads)}): free each chunk's tensors before the next chunk"
                          + ("" if case.chunk else ", and size the default chunks by Liger's rule (liger_chunk_size)"))
    _kept(report, what)


def _no_logits_tensor(report, case, dtype, what, fix="compute one chunk of tokens at a time"):
    logits = case.n * case.v * dtype.itemsize
    if case.n <= case.h:  # dW (V x H) is as large as the logits: the peak tells
        return
    if report.largest_bytes is not None and report.largest_bytes >= logits:
        raise CheckFailed(f"{what}: a tensor of {format_bytes(report.largest_bytes)} existed during the call; the "
                          f"full logits are {format_bytes(logits)}: {fix}")


# ------------------------------------------------------------- exercise 3: the Triton kernels, in tiles

BLOCK = _config("ce_rows")["BLOCK"]  # the reference kernels' block on this machine

# chunks: tiles of whole rows (Vc >= V), tiles over the vocabulary (Vc < V, dividing V or not), or None
# (chunk_plan's). The softcap cases with tiles narrower than a block catch padding lanes that enter the sum.
TILE_CASES = [
    Case(40, 16, 300, ignored=0.2, chunks=(16, 300)),
    Case(37, 16, 1000, ignore_first=16, ignored=0.1, smoothing=0.1, ignore_index=-1, chunks=(16, 256)),
    Case(20, 8, 513, ignored=1.0, chunks=(8, 200)),
    Case(64, 32, 700, bias=True, reduction="sum", fp32_dw=True, dtype="half", chunks=None),
    Case(32, 16, 40, softcap=2.0, ignored=0.2, ignore_index=0, bias=True, chunks=(16, 20)),
    Case(50, 24, 513, bias=True, smoothing=0.1, ignored=0.3, chunks=(32, 128), hidden=True),
    Case(30, 16, 2100, softcap=4.0, reduction="sum", ignore_index=-1, chunks=(16, 1024), hidden=True),
    Case(33, 16, 130, ignore_first=32, bias=True, ignore_index=0, fp32_dw=True, dtype="half", chunks=(32, 200),
         hidden=True),
    Case(48, 16, 777, smoothing=0.05, softcap=3.0, ignored=0.1, chunks=(16, 300), hidden=True),
    Case(24, 8, 300, ignored=1.0, chunks=None, hidden=True),
    Case(48, 16, 60, softcap=1.5, ignored=0.2, bias=True, smoothing=0.1, chunks=(16, 20), hidden=True),
    Case(256, 16, 40, fp32_dw=True, dtype="half", chunks=(1, 40), repeated=True),
    Case(200, 8, 24, fp32_dw=True, bias=True, reduction="sum", dtype="half", chunks=(1, 24), repeated=True,
         hidden=True),
]
if memfit.HAS_GPU:  # output layers of real size, and a tile wider than the GPU's block
    TILE_CASES += [Case(300, 64, 5000, ignored=0.1, smoothing=0.1, chunks=(128, 4100)),
                   Case(1000, 256, 32001, ignored=0.1, chunks=(256, 8192), hidden=True),
                   Case(2048, 512, 50257, bias=True, smoothing=0.1, chunks=None, hidden=True)]

# Arguments the fused loss cannot take (check_linear_ce_inputs, given in the notebook): ValueError.
INVALID = ("weight of another hidden size", "int32 targets", "reduction='none'", "a bias of the wrong size",
           "label_smoothing=1", "softcap=0")


def _invalid_call(kind, n):
    x, w, t, b = Case(n, 16, 50).inputs(torch.float32, 1)
    args, options = [x, w, t], {}
    if kind == "weight of another hidden size":
        args[1] = w[:, :-1]
    elif kind == "int32 targets":
        args[2] = t.int()
    elif kind == "reduction='none'":
        options["reduction"] = "none"
    elif kind == "a bias of the wrong size":
        args.append(b[:-1] if b is not None else torch.zeros(49, device=memfit.DEVICE))
    elif kind == "label_smoothing=1":
        options["label_smoothing"] = 1.0
    elif kind == "softcap=0":
        options["softcap"] = 0.0
    return args, options


def _tiles(case, n=None, v=None, elem=None):
    n, v = n or case.n, v or case.v
    chunks = case.chunks or reference.chunk_plan(n, case.h, v, elem)
    return min(chunks[0], n), min(chunks[1], v)


def _tile_axes(case, dtype) -> dict:
    rows, cols = _tiles(case, elem=dtype.itemsize)
    axes = case.axes(dtype, chunk_rows=rows)
    axes.update({"bias": case.bias, "fp32_dw": case.fp32_dw,
                 "rows": "one row repeated (dW summed over 200+ chunks)" if case.repeated else "drawn",
                 "chunks": "None" if case.chunks is None else "whole rows" if cols >= case.v else "vocabulary tiles",
                 "last_chunk": "full" if case.n % rows == 0 else "partial",
                 "tile_vs_block": "narrower than a block" if cols < BLOCK else "more than one block"})
    if cols < case.v:
        axes["last_tile"] = "full" if case.v % cols == 0 else "partial"
    return axes



def _softmax_free(fn, what):
    """fn() with PyTorch's ops recorded (an interpreted launch's own copies not): the softmax is the kernels'."""
    with LiveTensorMeter() as recorder:
        got = fn()
    _no_softmax(recorder.ops, what)
    return got


def check_fused_linear_ce_forward(fused_linear_ce_forward, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    for index, case, dtype in _plan(TILE_CASES, cases):
        _check_tiled_case(fused_linear_ce_forward, case, dtype, 300 + 10 * index + (500 if case.hidden else 0))
    for which, n in ((visible, 8), (hidden, 11)):
        for kind in INVALID if which else ():
            args, options = _invalid_call(kind, n)
            expect_value_error(lambda *a: fused_linear_ce_forward(*a, **options), *args,
                               what=f"fused_linear_ce_forward with {kind} (N={n})", why="naming the bad argument")
    if hidden:
        def check_one(d: dict) -> None:
            chunks = None if d["chunks"] is None else (min(d["chunks"][0], d["n"]), min(d["chunks"][1], d["v"]))
            case = _drawn_loss_case(d, d["h"], bias=d["bias"], fp32_dw=d["fp32_dw"], chunks=chunks)
            _check_tiled_case(fused_linear_ce_forward, case, case.dtype_at(0), d["seed"])
        grade_drawn(fused_domain(), "fused_linear_ce_forward", DRAWN_FUSED_CASES, check_one)


def fused_domain() -> dict:
    """Every call exercise 3's text allows: tiles of the caller's (a row, a column, tiles wider than a block, ragged
    last ones) or chunk_plan's, fp32_dw on and off, a bias, and the loss options (chunked_linear_ce's domain)."""
    return {**{k: v for k, v in chunk_domain().items() if k not in ("chunk_size", "ignored")},
            "ignored": Choice("none", "some", "all"), "fp32_dw": Choice(False, True),
            "n": Sizes(1, 48, edges=(1, 7, 8, 9, 16, 17)),
            "chunks": Choice(None, (16, 64), (7, 33), (16, BLOCK + 3), (8, 5))}  # (a tile a step: few, for the CPU)


DRAWN_FUSED_CASES = 4


def _check_tiled_case(fused_linear_ce_forward, case, dtype, seed) -> None:
    x, w, t, b = case.inputs(dtype, seed)
    tiles = f"chunks={case.chunks}" if case.chunks else "the default chunk_plan"
    what = f"fused_linear_ce_forward({case.describe(dtype)}, {tiles})"
    with guarded_allocations(what):
        got = _softmax_free(lambda: call_pure(fused_linear_ce_forward, x, w, t, b, **case.options(True),
                                              chunks=case.chunks, what=what), what)
    _compare(got, x, w, t, b, case, dtype, what)


# Softmax-shaped work PyTorch must not do on the logits: the kernels do it.
SOFTMAX_OPS = frozenset({"aten._log_softmax", "aten._softmax", "aten.logsumexp", "aten.nll_loss_forward",
                         "aten.nll_loss_nd", "aten.cross_entropy_loss", "aten.exp", "aten.amax"})


def _no_softmax(ops, what):
    used = sorted(set(ops) & SOFTMAX_OPS)
    if used:
        raise CheckFailed(f"{what}: PyTorch computed a softmax ({', '.join(used)}): the logsumexp and dlogits "
                          "belong in ce_stats_kernel and ce_grad_kernel")


SCRATCH_SLACK = 64 << 10  # a few small temporaries (lse, masks, a row's loss)


def _scratch(case, dtype) -> tuple[int, str]:
    """The scratch a tiled forward needs beyond dX + dW, from its plan: one tile of logits, an fp32 dX_c
    accumulator and one C x H product in fp32 and in the input dtype (chunk_plan's docstring), per-token statistics, and with fp32_dw the fp32
    dW buffer and one tile's product; at least 5% of dX + dW (the CUDA allocator's rounding)."""
    elem = dtype.itemsize
    rows, cols = _tiles(case, elem=elem)
    grads = (case.n + case.v) * case.h * elem
    # the C x H product comes out of the matmul in the input dtype and may be cast once to fp32 before the add
    # (on an H100, three right implementations peaked 0.16 MiB above an allowance that counted it in fp32 only)
    scratch = rows * cols * elem + rows * case.h * (2 * 4 + elem) + 16 * case.n * 4 + SCRATCH_SLACK
    said = (f"one tile of {rows} x {cols} logits, a {rows} x {case.h} fp32 accumulator and product (and the "
            "product in the input dtype), per-token vectors")
    if case.fp32_dw:
        scratch += case.v * case.h * 4 + cols * case.h * 4
        said += ", the fp32 dW buffer"
    return max(scratch, grads // 20), said


# Memory on every call path: chunks None and given (vocabulary tiles), fp32_dw off and on, each dtype; the
# hidden sizes differ from the visible ones and from the numerics' (a cache keyed by size would hide). The
# visible default-path case has logits above chunk_plan's 1 MiB floor, so its tile is less than all of them (a
# tile of every logit shows); at the hidden one's size the plan's one tile holds them all.
FUSED_MEMORY = [Case(530, 32, 500, ignored=0.1, chunks=None, dtype="float32"),
                Case(16, 32, 3000, chunks=(16, 256), dtype="float32"),
                Case(32, 64, 1000, ignored=0.1, chunks=(16, 512), dtype=DTYPE_NAMES[1]),
                Case(32, 64, 1000, chunks=(16, 512), fp32_dw=True, dtype=DTYPE_NAMES[1]),
                Case(40, 32, 900, ignored=0.1, chunks=None, dtype=DTYPE_NAMES[1], hidden=True),
                Case(24, 48, 1100, ignore_index=-1, ignored=0.2, chunks=(16, 384), dtype="float32", hidden=True),
                Case(24, 48, 1100, chunks=(16, 384), fp32_dw=True, dtype=DTYPE_NAMES[1], hidden=True),
                # many row chunks of a narrow vocabulary: dX's accumulator is one chunk's (C x H in fp32), so one
                # for every token (N x H in fp32) shows above the scratch allowance
                Case(256, 256, 200, chunks=(16, 128), dtype=DTYPE_NAMES[1]),
                Case(300, 192, 260, ignored=0.1, chunks=(16, 128), dtype="float32", hidden=True)]
if len(DTYPES) > 2:
    FUSED_MEMORY += [Case(40, 64, 1000, chunks=(16, 512), dtype=DTYPE_NAMES[2]),
                     Case(24, 48, 1200, chunks=(16, 384), dtype=DTYPE_NAMES[2], hidden=True)]
if memfit.HAS_GPU:  # the CUDA allocator's figure at an output layer's size, on the default path in each dtype
    FUSED_MEMORY += [Case(4096, 1024, 32768, ignored=0.1, chunks=None, dtype=d) for d in DTYPE_NAMES[1:]] + \
                    [Case(2048, 768, 50257, chunks=None, dtype=d, hidden=True) for d in DTYPE_NAMES[1:]]


def _memory_axes(case, dtype) -> dict:
    return {"dtype": _name(dtype), "chunks": "None" if case.chunks is None else "given", "fp32_dw": case.fp32_dw,
            "kept": "after the call"}


def check_fused_linear_ce_memory(fused_linear_ce_forward, cases: str = "visible") -> None:
    for index, case, dtype in _plan(FUSED_MEMORY, cases):
        _fused_memory_case(fused_linear_ce_forward, case, dtype, 11 + index)
    if check_cases(cases)[1]:
        def check_one(d: dict) -> None:
            chunks = None if d["chunks"] is None else (min(d["chunks"][0], d["n"]), min(d["chunks"][1], d["v"]))
            case = _drawn_loss_case(d, d["h"], fp32_dw=d["fp32_dw"], chunks=chunks)
            _fused_memory_case(fused_linear_ce_forward, case, case.dtype_at(0), d["seed"])
        grade_drawn(FUSED_MEMORY_DOMAIN, "fused_linear_ce_memory", DRAWN_FUSED_MEMORY_CASES, check_one)


# Every measured call a CPU runs in seconds: many tokens and a vocabulary of several tiles (or chunk_plan's one),
# a wide H (a copy of dX or dW shows), fp32_dw on and off, the loss options.
FUSED_MEMORY_DOMAIN = {**_loss_axes(), "n": Sizes(16, 300, edges=(16,)), "h": Sizes(32, 96, edges=(32,)),
                       "v": Sizes(200, 1200, edges=(200,)), "fp32_dw": Choice(False, True),
                       "chunks": Choice(None, (16, 256), (32, 128))}
DRAWN_FUSED_MEMORY_CASES = 1


def _fused_memory_case(fused_linear_ce_forward, case, dtype, seed: int) -> None:
    x, w, t, _ = case.inputs(dtype, seed)
    tiles = f"chunks={case.chunks}" if case.chunks else "the default chunk_plan"
    what = f"fused_linear_ce_forward({case.describe(dtype)}, {tiles})"
    big = case.n * case.v > 10 ** 7
    _, report = measure_peak(lambda: call_learner(fused_linear_ce_forward, x, w, t, **case.options(True),
                                                  chunks=case.chunks, what=what),
                             device=memfit.DEVICE, meter=None if big else LIVE_TENSORS, warmup=big)
    rows, cols = _tiles(case, elem=dtype.itemsize)
    if not big and rows * cols < case.n * case.v:  # where the plan's one tile is not all the logits
        _no_logits_tensor(report, case, dtype, what, f"the plan's tiles are {rows} tokens x {cols} words: "
                          "allocate one tile of that size, and loop over the vocabulary as well as the tokens")
    if not big:
        _no_softmax(report.ops, what)
    grads = (case.n + case.v) * case.h * x.element_size()
    scratch, said = _scratch(case, dtype)
    if report.peak_bytes > grads + scratch:
        raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds dX + dW "
                          f"({format_bytes(grads)}) plus {format_bytes(scratch)} of scratch ({said}): reuse "
                          "one tile buffer, overwrite its logits with their gradient, and accumulate dW in "
                          "the weight's dtype unless fp32_dw=True")
    _kept(report, what)


# ------------------------------------------------------------------- exercise 4: the autograd Function

# lead: x's shape without H (the tokens of a batch of sequences); layout: x and targets contiguous, or views with
# their first two dimensions transposed; g: the loss's upstream gradient.
FUNCTION_CASES = [
    Case(40, 16, 300, ignored=0.2, lead=(2, 20), g=3.0, dtype="float32"),
    Case(48, 16, 130, bias=True, smoothing=0.1, softcap=5.0, ignored=0.2, ignore_index=-1, lead=(2, 3, 8), g=1.0,
         layout="transposed view"),
    Case(24, 8, 100, reduction="sum", fp32_dw=True, ignored=0.2, ignore_index=0, lead=(24,), g=0.5, dtype="half"),
    Case(48, 16, 513, bias=True, smoothing=0.1, softcap=5.0, ignored=0.2, lead=(4, 3, 4), g=0.25, hidden=True),
    Case(60, 16, 200, ignored=0.3, ignore_index=-1, reduction="sum", lead=(5, 12), g=1.0, layout="transposed view",
         dtype="float32", hidden=True),
    Case(30, 8, 150, fp32_dw=True, bias=True, ignore_index=0, ignored=0.1, lead=(30,), g=2.0, dtype="half",
         hidden=True),
]
if len(DTYPES) > 2:  # each dtype of the profile in both sets
    FUNCTION_CASES += [Case(32, 16, 200, ignored=0.1, lead=(4, 8), g=2.0, dtype=DTYPE_NAMES[2]),
                       Case(36, 16, 210, ignored=0.1, lead=(6, 6), g=2.0, dtype=DTYPE_NAMES[2], hidden=True)]
FUNCTION_CASES += [Case(20, 8, 90, smoothing=0.1, lead=(4, 5), g=3.0, dtype=DTYPE_NAMES[1], layout="transposed view"),
                   Case(28, 8, 95, lead=(2, 2, 7), g=0.5, dtype=DTYPE_NAMES[1], hidden=True)]

# Memory of forward + backward: H large against the tile, so a copy of dX + dW in backward shows.
FUNCTION_MEMORY = [Case(32, 128, 1000, ignored=0.1, dtype=d) for d in DTYPE_NAMES] + \
                  [Case(24, 128, 900, ignored=0.1, dtype=d, hidden=True) for d in DTYPE_NAMES]
if memfit.HAS_GPU:
    FUNCTION_MEMORY += [Case(4096, 1024, 32768, ignored=0.1, dtype="half")]


def _as_given(case, a, leaf=False):
    """a's (N, ...) tokens as the case hands them over: shaped lead, and for a transposed view stored with the
    first two dims swapped. Returns (the tensor the function gets, the stored tensor, stored grad -> (N, ...))."""
    shaped = a.reshape(*case.lead, *a.shape[1:])
    if case.layout != "transposed view":
        stored = shaped.requires_grad_(True) if leaf else shaped
        return stored, stored, lambda grad: grad.reshape(a.shape)
    stored = shaped.transpose(0, 1).contiguous()
    if leaf:
        stored.requires_grad_(True)
    return stored.transpose(0, 1), stored, lambda grad: grad.transpose(0, 1).reshape(a.shape)


def _function_axes(case, dtype) -> dict:
    axes = case.axes(dtype)
    axes.update({"bias": case.bias, "fp32_dw": case.fp32_dw, "x_rank": len(case.lead) + 1, "layout": case.layout,
                 "upstream_g": "1" if case.g == 1.0 else "not 1"})
    return axes


def check_fused_linear_cross_entropy(fused_linear_cross_entropy, cases: str = "visible") -> None:
    with given_references(fused_linear_cross_entropy, fused_linear_ce_forward=reference.fused_linear_ce_forward):
        for index, case, dtype in _plan(FUNCTION_CASES, cases):
            _check_function_case(fused_linear_cross_entropy, case, dtype, 400 + index + (50 if case.hidden else 0))
        for index, case, dtype in _plan(FUNCTION_MEMORY, cases):
            _check_function_memory(fused_linear_cross_entropy, case, dtype)
        if check_cases(cases)[1]:
            def check_one(d: dict) -> None:
                lead = (d["n"], 3, 2)[:d["x_rank"] - 1]  # x's leading dims: N·3·2 tokens at rank 4
                case = _drawn_loss_case({**d, "n": math.prod(lead)}, d["h"], bias=d["bias"], fp32_dw=d["fp32_dw"],
                                        g=d["upstream_g"], layout=d["layout"] if d["x_rank"] > 2 else "contiguous",
                                        lead=lead)
                _check_function_case(fused_linear_cross_entropy, case, case.dtype_at(0), d["seed"])
            grade_drawn(function_domain(), "fused_linear_cross_entropy", DRAWN_FUNCTION_CASES, check_one)


def function_domain() -> dict:
    """Every call exercise 4's text allows: x of rank 2 to 4 (tokens over the leading dims; N counts the first), as
    transposed views too, a backward of any upstream gradient, and the loss options of exercise 3."""
    domain = {k: v for k, v in fused_domain().items() if k not in ("chunks", "ignored")}
    return {**domain, "n": Sizes(1, 24, edges=(1, 2)), "ignored": Choice("none", "some"),
            "x_rank": Choice(2, 3, 4), "layout": Choice("contiguous", "transposed view"),
            "upstream_g": Choice(1.0, 3.0, -0.5)}


DRAWN_FUNCTION_CASES = 3


def _check_function_case(fused_linear_cross_entropy, case, dtype, seed):
    x, w, t, b = case.inputs(dtype, seed)
    g = case.g
    what = (f"fused_linear_cross_entropy({case.describe(dtype)}, x of shape {(*case.lead, case.h)}"
            + (", x and targets transposed views" if case.layout != "contiguous" else "")
            + f", backward of {g} x loss)")
    xv, x_leaf, dx_of = _as_given(case, x.detach().clone(), leaf=True)
    tv = _as_given(case, t)[0]
    leaves = [None if a is None else a.detach().clone().requires_grad_(True) for a in (w, b)]
    loss = call_pure(fused_linear_cross_entropy, xv, leaves[0], tv, leaves[1], **case.options(True), what=what)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.requires_grad:
        raise CheckFailed(f"{what}: should return a 0-dim loss that autograd can differentiate")
    call_learner((loss * g).backward, what=what + ", backward")
    exact, same = _references(x, w, t, b, case)
    bounds = _rounding_bounds(x, w, t, b, case, exact)
    _close(loss.detach().float(), exact[0], same[0].float(), what + ", loss", _loss_floor(dtype, case.v),
           bound=bounds[0])
    for name, leaf, e, s, terms, reshape, bound in (
            ("x.grad", x_leaf, exact[1], same[1], case.v, dx_of, bounds[1]),
            ("weight.grad", leaves[0], exact[2], same[2], case.n, None, bounds[2]),
            ("bias.grad", leaves[1], exact[3], same[3], case.n, None, bounds[3])):
        if leaf is None:
            continue
        if leaf.grad is None:
            raise CheckFailed(f"{what}: {name} is None: backward should return the gradient for it")
        grad = leaf.grad if reshape is None else reshape(leaf.grad)
        _close(grad, e * g, s * g, f"{what}, {name}", _floor(dtype, terms), bound=None if bound is None else bound * abs(g))


def _check_function_memory(fused_linear_cross_entropy, case, dtype):
    x, w, t, _ = case.inputs(dtype, 12)
    x.requires_grad_(True)
    w.requires_grad_(True)
    grads = (case.n + case.v) * case.h * x.element_size()
    what = f"fused_linear_cross_entropy forward + backward of 3 x loss ({case.describe(dtype)})"

    def forward_backward():
        (call_learner(fused_linear_cross_entropy, x, w, t, what=what) * 3).backward()

    # No warm-up call: its gradients would sit in .grad, inside the baseline.
    big = case.n * case.v > 10 ** 7  # the CUDA allocator's figure at an output layer's size; else the live meter
    _, report = measure_peak(lambda: call_learner(forward_backward, what=what), device=memfit.DEVICE,
                             meter=None if big else LIVE_TENSORS, warmup=False)
    scratch, said = _scratch(case, dtype)
    if report.peak_bytes > grads + scratch:
        raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds x.grad + "
                          f"weight.grad ({format_bytes(grads)}) plus {format_bytes(scratch)} of scratch ({said}): "
                          "scale the saved gradients in place in backward; a copy doubles dW")
    _kept(report, what, allowed=grads + KEPT_ALLOWED, besides="x.grad and weight.grad")


# ------------------------------------------------------------------------------------------- axes

_COMMON = {"dtype": DTYPE_NAMES, "reduction": ("mean", "sum"), "ignore_index": (-100, -1, 0),
           "label_smoothing": ("off", "on"), "softcap": ("off", "on")}

AXES = {
    "cross_entropy_with_grad": {**_COMMON, "ignored": ("none", "some", "some, with label smoothing", "all"),
                                "magnitude": ("ordinary", "large (exp overflows without the row's maximum)")},
    "chunked_linear_ce": {**_COMMON, "ignored": ("none", "some", "some, with label smoothing", "all",
                                                 "a whole chunk"),
                          "bias": (False, True), "chunk_size": ("given", "None"),
                          "last_chunk": ("divides N", "a partial last chunk"),
                          "memory": ("chunk_size given", "chunk_size None", "kept after the call"),
                          "memory_dtype": DTYPE_NAMES},
    "fused_linear_ce_forward": {**_COMMON, "ignored": ("none", "some", "some, with label smoothing", "all",
                                                       "a whole chunk"),
                                "bias": (False, True), "fp32_dw": (False, True),
                                "rows": ("drawn", "one row repeated (dW summed over 200+ chunks)"),
                                "chunks": ("None", "whole rows", "vocabulary tiles"),
                                "last_chunk": ("full", "partial"), "last_tile": ("full", "partial"),
                                "tile_vs_block": ("narrower than a block", "more than one block"),
                                "arguments": ("valid",) + INVALID},
    "fused_linear_ce_memory": {"dtype": DTYPE_NAMES, "chunks": ("None", "given"), "fp32_dw": (False, True),
                               "kept": ("after the call",)},
    "fused_linear_cross_entropy": {**_COMMON, "ignored": ("none", "some", "some, with label smoothing"),
                                   "bias": (False, True), "fp32_dw": (False, True), "x_rank": (2, 3, 4),
                                   "layout": ("contiguous", "transposed view"), "upstream_g": ("1", "not 1"),
                                   "memory_dtype": DTYPE_NAMES,
                                   "memory": ("forward + backward", "kept after the call")},
}


def _ce_axes(case, dtype) -> dict:
    axes = case.axes(dtype)
    axes["magnitude"] = "ordinary" if case.magnitude == "ordinary" else AXES["cross_entropy_with_grad"]["magnitude"][1]
    return axes


def _chunk_axes(case, dtype) -> dict:
    rows = case.chunk or reference.liger_chunk_size(case.n, case.h, case.v)
    axes = case.axes(dtype, chunk_rows=rows)
    axes.update({"bias": case.bias, "chunk_size": "given" if case.chunk else "None", "last_chunk": _chunk_fit(case)})
    return axes


def case_axes(check: str, cases: str) -> list[dict]:
    """The cases `check` runs under `cases` ("visible" or "hidden"), each as {axis: value}: read from the same
    records the check iterates over."""
    if check == "cross_entropy_with_grad":
        return [_ce_axes(case, dtype) for _, case, dtype in _plan(CE_CASES, cases)]
    if check == "chunked_linear_ce":
        return [_chunk_axes(case, dtype) for _, case, dtype in _plan(CHUNK_CASES, cases)] + \
               [{"memory": ("chunk_size given" if case.chunk else "chunk_size None", "kept after the call"),
                 "memory_dtype": _name(dtype)} for _, case, dtype in _plan(CHUNK_MEMORY, cases)]
    if check == "fused_linear_ce_forward":
        return [{**_tile_axes(case, dtype), "arguments": "valid"} for _, case, dtype in _plan(TILE_CASES, cases)] + \
               [{"arguments": INVALID}]
    if check == "fused_linear_ce_memory":
        return [_memory_axes(case, dtype) for _, case, dtype in _plan(FUSED_MEMORY, cases)]
    if check == "fused_linear_cross_entropy":
        return [_function_axes(case, dtype) for _, case, dtype in _plan(FUNCTION_CASES, cases)] + \
               [{"memory": ("forward + backward", "kept after the call"), "memory_dtype": _name(dtype)}
                for _, case, dtype in _plan(FUNCTION_MEMORY, cases)]
    raise KeyError(f"lesson 06 has no check {check!r}")


CHECKS = [
    Check("cross_entropy_with_grad", 2, check_cross_entropy_with_grad, uses=("cross_entropy_with_grad",)),
    Check("chunked_linear_ce", 3, check_chunked_linear_ce, uses=("chunked_linear_ce",)),
    Check("fused_linear_ce_forward", 3, check_fused_linear_ce_forward, uses=("fused_linear_ce_forward",),
          timeout_s=600),
    Check("fused_linear_ce_memory", 2, check_fused_linear_ce_memory, uses=("fused_linear_ce_forward",),
          timeout_s=600),
    Check("fused_linear_cross_entropy", 2, check_fused_linear_cross_entropy, uses=("fused_linear_cross_entropy",),
          timeout_s=600),
]

_ROWS = {"logits_ptr": "*{dtype}", "stride": "i32", "targets_ptr": "*i64"}
KERNELS = [
    KernelSpec("ce_stats_kernel", "ce_rows",
               {**_ROWS, "m_ptr": "*fp32", "l_ptr": "*fp32", "target_logit_ptr": "*fp32", "sum_ptr": "*fp32",
                "col0": "i32", "n_cols": "i32", "softcap": "fp32"}, constexprs=dict(SOFTCAP=True)),
    KernelSpec("ce_grad_kernel", "ce_rows",
               {**_ROWS, "lse_ptr": "*fp32", "col0": "i32", "n_cols": "i32", "vocab": "i32", "ignore_index": "i32",
                "scale": "fp32", "smoothing": "fp32", "softcap": "fp32"}, constexprs=dict(SOFTCAP=True)),
    # section 8's given kernels (not graded): they must compile for the small cards too
    KernelSpec("active_blocks_kernel", "ce_blocks",
               {"grad_ptr": "*{dtype}", "stride": "i32", "flags_ptr": "*i8", "n_rows": "i32", "n_cols": "i32",
                "threshold": "fp32"}),
    *(KernelSpec(kernel, "ce_blocks",
                 {"grad_ptr": "*{dtype}", "grad_stride": "i32", operand: "*{dtype}", operand_stride: "i32",
                  "out_ptr": out, "out_stride": "i32", "flags_ptr": "*i8", "n_rows": "i32", "n_cols": "i32",
                  "hidden": "i32"}, constexprs=dict(PRECISION="ieee", **extra))
      for kernel, operand, operand_stride, out, extra in (
          ("block_sparse_dx_kernel", "w_ptr", "w_stride", "*fp32", dict(ACCUMULATE=True)),
          ("block_sparse_dw_kernel", "x_ptr", "x_stride", "*{dtype}", {}))),
]
