"""Checks of lesson 06 (solutions/06_fused_linear_ce.ipynb): cross-entropy with its gradient in one pass, the
linear layer + cross-entropy chunked over tokens, the Triton version in tiles, and the autograd Function.

Numerics follow the course's rule (autograder/checks/numerics.py): loss, dX, dW and db against a float64
reference (F.linear + F.cross_entropy through autograd), at most 2x the error of PyTorch's same chain in the
input's dtype, plus a floor relative to the largest entry of each tensor. Cases cover ignored tokens (a whole
chunk of them, and a batch with nothing else), vocabularies that are not a multiple of the kernel's block or of
the tile, token counts that are not a multiple of the chunk, a bias, label smoothing and softcapping. Memory:
the live-tensor meter must see no tensor of tokens x vocabulary elements, and the peak stays within the
gradients the step returns plus a small scratch.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import memfit
from autograder.checks import Check, CheckFailed, KernelSpec, call_learner, check_cases, expect_value_error
from autograder.checks.numerics import assert_close_by_rule, expect_like, poisoned_allocations, training_half
from autograder.checks.numerics import case_dtypes as _dtypes, dtype_name as _name, seeded_randn as _randn
from memfit.meter import LIVE_TENSORS, format_bytes, measure_peak

IGNORE = -100


class Case:
    """One problem: n tokens, hidden h, vocabulary v; which tokens are ignored; the loss's options."""

    def __init__(self, n, h, v, ignored=0.0, smoothing=0.0, softcap=None, bias=False, reduction="mean",
                 chunk=None, columns=None, ignore_first=0):
        self.n, self.h, self.v, self.ignored, self.smoothing = n, h, v, ignored, smoothing
        self.softcap, self.bias, self.reduction = softcap, bias, reduction
        self.chunk, self.columns, self.ignore_first = chunk, columns, ignore_first

    def describe(self, dtype) -> str:
        parts = [f"N={self.n}, H={self.h}, V={self.v}", _name(dtype), self.reduction]
        if self.ignored == 1.0:
            parts.append("every token ignored")
        elif self.ignored:
            parts.append(f"{self.ignored:.0%} of tokens ignored")
        if self.ignore_first:
            parts.append(f"the first {self.ignore_first} tokens ignored")
        if self.bias:
            parts.append("bias")
        if self.smoothing:
            parts.append(f"label_smoothing={self.smoothing}")
        if self.softcap:
            parts.append(f"softcap={self.softcap}")
        return ", ".join(parts)

    def targets(self, seed):
        gen = torch.Generator().manual_seed(seed + 3)
        t = torch.randint(0, self.v, (self.n,), generator=gen)
        t[torch.rand(self.n, generator=gen) < self.ignored] = IGNORE
        t[: self.ignore_first] = IGNORE
        return t.to(memfit.DEVICE)

    def inputs(self, dtype, seed):
        x = _randn((self.n, self.h), dtype, seed)
        w = _randn((self.v, self.h), dtype, seed + 1, scale=2.0 / math.sqrt(self.h))
        b = _randn((self.v,), dtype, seed + 2, scale=0.5) if self.bias else None
        return x, w, self.targets(seed), b

    def options(self):
        return dict(ignore_index=IGNORE, reduction=self.reduction, label_smoothing=self.smoothing,
                    softcap=self.softcap)


def _chain(x, w, t, b, case, logits_only=False):
    logits = F.linear(x, w, b)
    if case.softcap:
        logits = case.softcap * torch.tanh(logits / case.softcap)
    if logits_only:
        return logits
    if (t == IGNORE).all() and case.reduction == "mean":
        return logits.sum() * 0  # the mean over no token: defined as 0 (PyTorch would give NaN)
    return F.cross_entropy(logits, t, ignore_index=IGNORE, reduction=case.reduction,
                           label_smoothing=case.smoothing)


def _grads(x, w, t, b, case, cast):
    """(loss, dx, dw, db) of PyTorch's chain on cast(inputs), by autograd."""
    leaves = [None if a is None else cast(a).detach().clone().requires_grad_(True) for a in (x, w, b)]
    loss = _chain(leaves[0], leaves[1], t, leaves[2], case)
    loss.backward()
    return (loss.detach(), *[None if a is None else a.grad for a in leaves])


def _references(x, w, t, b, case):
    return _grads(x, w, t, b, case, torch.Tensor.double), _grads(x, w, t, b, case, lambda a: a)


def _power_of_two_scale(exact: torch.Tensor) -> float:
    """2^k bringing the largest |entry| into [0.5, 1): the rule's floor becomes relative to this tensor, and
    multiplying by a power of two is exact."""
    peak = exact.abs().max().item() if exact.numel() else 0.0
    return 1.0 if peak == 0 or not math.isfinite(peak) else 2.0 ** -math.ceil(math.log2(peak))


def _close(got, exact, same, what, floor_ulps):
    expect_like(got, same, what)
    k = _power_of_two_scale(exact)
    assert_close_by_rule(got * k, exact * k, same * k, what, floor_ulps=floor_ulps)


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
    loss = got[0]
    if not isinstance(loss, torch.Tensor) or loss.dtype != torch.float32 or loss.dim() != 0:
        raise CheckFailed(f"{what}: the loss should be a 0-dim fp32 tensor, got "
                          f"{getattr(loss, 'dtype', type(loss).__name__)} of shape {tuple(getattr(loss, 'shape', ()))}")
    same_loss = same[0].float() if torch.isfinite(same[0]) else exact[0].float()
    _close(loss, exact[0], same_loss, what + ", loss", _loss_floor(dtype, case.v))
    _close(got[1], exact[1], same[1], what + ", dx", _floor(dtype, case.v))
    _close(got[2], exact[2], same[2], what + ", dw", _floor(dtype, case.n))
    if case.bias:
        _close(got[3], exact[3], same[3], what + ", db", _floor(dtype, case.n))
    elif got[3] is not None:
        raise CheckFailed(f"{what}: without a bias, db should be None")


# -------------------------------------------------------------------------- exercise 1: loss and dlogits

LOGIT_VISIBLE = [Case(8, 0, 50), Case(33, 0, 1000, ignored=0.3), Case(16, 0, 300, reduction="sum", smoothing=0.1),
                 Case(10, 0, 200, ignored=1.0)]
LOGIT_HIDDEN = [Case(40, 0, 513, softcap=5.0, ignored=0.2), Case(7, 0, 2049, smoothing=0.2, ignored=0.5),
                Case(64, 0, 100, reduction="sum", softcap=3.0, smoothing=0.05)]


def check_cross_entropy_with_grad(cross_entropy_with_grad, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    plan = (LOGIT_VISIBLE if visible else []) + (LOGIT_HIDDEN if hidden else [])
    dtypes = _dtypes(hidden)
    for seed, case in enumerate(plan):
        dtype = dtypes[seed % len(dtypes)]
        scale = 8.0 if case.softcap else 3.0  # peaked rows; softcap cases reach the cap's curved part
        logits = _randn((case.n, case.v), dtype, 100 + seed, scale=scale)
        t = case.targets(100 + seed)
        what = f"cross_entropy_with_grad({case.describe(dtype).replace(', H=0', '')})"
        got = call_learner(cross_entropy_with_grad, logits, t, **case.options(), what=what)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise CheckFailed(f"{what} should return (loss, dlogits), got {type(got).__name__}")
        results = {}
        for key, cast in (("exact", torch.Tensor.double), ("same", lambda a: a)):
            leaf = cast(logits).detach().clone().requires_grad_(True)
            capped = case.softcap * torch.tanh(leaf / case.softcap) if case.softcap else leaf
            if (t == IGNORE).all() and case.reduction == "mean":
                loss = capped.sum() * 0
            else:
                loss = F.cross_entropy(capped, t, ignore_index=IGNORE, reduction=case.reduction,
                                       label_smoothing=case.smoothing)
            loss.backward()
            results[key] = (loss.detach(), leaf.grad)
        loss, dlogits = got
        if not isinstance(loss, torch.Tensor) or loss.dtype != torch.float32 or loss.dim() != 0:
            raise CheckFailed(f"{what}: the loss should be a 0-dim fp32 tensor, got "
                              f"{getattr(loss, 'dtype', type(loss).__name__)}")
        _close(loss, results["exact"][0], results["same"][0].float(), what + ", loss", _loss_floor(dtype, case.v))
        _close(dlogits, results["exact"][1], results["same"][1], what + ", dlogits", _floor(dtype, 1))


# ------------------------------------------------------------------------ exercise 2: chunks of tokens

CHUNK_VISIBLE = [Case(40, 16, 300, ignored=0.2, chunk=16), Case(64, 32, 1000, chunk=None),
                 Case(37, 16, 257, ignore_first=16, chunk=16), Case(12, 8, 100, ignored=1.0, chunk=8)]
CHUNK_HIDDEN = [Case(50, 24, 513, bias=True, smoothing=0.1, chunk=16, ignored=0.3),
                Case(30, 16, 700, softcap=4.0, reduction="sum", chunk=8),
                Case(33, 16, 128, ignore_first=32, chunk=32, bias=True)]


def _chunk_message(case) -> str:
    return f"chunk_size={case.chunk}" if case.chunk else "the default chunk size"


def check_chunked_linear_ce(chunked_linear_ce, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    plan = (CHUNK_VISIBLE if visible else []) + (CHUNK_HIDDEN if hidden else [])
    dtypes = _dtypes(hidden)
    for seed, case in enumerate(plan):
        dtype = dtypes[seed % len(dtypes)]
        x, w, t, b = case.inputs(dtype, 200 + 10 * seed)
        what = f"chunked_linear_ce({case.describe(dtype)}, {_chunk_message(case)})"
        with poisoned_allocations():
            got = call_learner(chunked_linear_ce, x, w, t, b, **case.options(), chunk_size=case.chunk, what=what)
        _compare(got, x, w, t, b, case, dtype, what)
    if visible:
        _check_no_logits_tensor(lambda x, w, t: chunked_linear_ce(x, w, t, chunk_size=16), "chunked_linear_ce",
                                "chunk_size=16", chunk_rows=16)


# ------------------------------------------------------------- exercise 3: the Triton kernels, in tiles

# (case, chunks): tiles of whole rows (Vc >= V) and tiles over the vocabulary (Vc < V, not dividing V).
TILE_VISIBLE = [(Case(40, 16, 300, ignored=0.2), (16, 300)), (Case(37, 16, 1000, ignore_first=16), (16, 256)),
                (Case(20, 8, 513, ignored=1.0), (8, 200)), (Case(64, 32, 700), None)]
TILE_HIDDEN = [(Case(50, 24, 513, bias=True, smoothing=0.1, ignored=0.3), (32, 128)),
               (Case(30, 16, 2100, softcap=4.0, reduction="sum"), (16, 1024)),
               (Case(33, 16, 130, ignore_first=32, bias=True), (32, 200)),
               (Case(48, 16, 777, smoothing=0.05, softcap=3.0, ignored=0.1), (16, 300))]
TILE_HIDDEN_GPU = [(Case(1000, 256, 32001, ignored=0.1), (256, 8192)),
                   (Case(2048, 512, 50257, bias=True, smoothing=0.1), None)]


def check_fused_linear_ce_forward(fused_linear_ce_forward, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    plan = (TILE_VISIBLE if visible else []) + (TILE_HIDDEN + (TILE_HIDDEN_GPU if memfit.HAS_GPU else [])
                                                if hidden else [])
    dtypes = _dtypes(hidden)
    for seed, (case, chunks) in enumerate(plan):
        dtype = dtypes[seed % len(dtypes)]
        x, w, t, b = case.inputs(dtype, 300 + 10 * seed)
        tiles = f"chunks={chunks}" if chunks else "the default chunk_plan"
        what = f"fused_linear_ce_forward({case.describe(dtype)}, {tiles})"
        with poisoned_allocations():
            got = call_learner(fused_linear_ce_forward, x, w, t, b, **case.options(), chunks=chunks, what=what)
        _compare(got, x, w, t, b, case, dtype, what)
    if visible:
        x, w, t, _ = Case(8, 16, 50).inputs(torch.float32, 1)
        expect_value_error(fused_linear_ce_forward, x, w[:, :-1], t, what="fused_linear_ce_forward with weight of "
                           "hidden size 15 and x of 16", why="naming the shapes")
        expect_value_error(fused_linear_ce_forward, x, w, t.int(), what="fused_linear_ce_forward with int32 targets",
                           why="naming the dtype")
        expect_value_error(fused_linear_ce_forward, x, w, t, None, IGNORE, "none",
                           what="fused_linear_ce_forward with reduction='none'", why="naming the reduction")


# Softmax-shaped work PyTorch must not do on the logits: the kernels do it.
SOFTMAX_OPS = frozenset({"aten._log_softmax", "aten._softmax", "aten.logsumexp", "aten.nll_loss_forward",
                         "aten.nll_loss_nd", "aten.cross_entropy_loss", "aten.exp", "aten.amax"})


def _check_no_logits_tensor(fn, name: str, setting: str, chunk_rows: int | None = None):
    """Live-tensor meter on fp32 inputs: no storage of N x V elements; with chunk_rows, nothing above a few
    chunks of logits either."""
    case = Case(128, 32, 3000, ignored=0.1)
    x, w, t, _ = case.inputs(torch.float32, 7)
    what = f"{name}(N={case.n}, H={case.h}, V={case.v}, fp32, {setting})"
    _, report = measure_peak(lambda: call_learner(fn, x, w, t, what=what), device=memfit.DEVICE, meter=LIVE_TENSORS,
                             warmup=False)
    logits = case.n * case.v * 4
    if report.largest_bytes >= logits:
        raise CheckFailed(f"{what}: a tensor of {format_bytes(report.largest_bytes)} existed during the call; the "
                          f"full logits are {format_bytes(logits)}: compute one chunk of tokens at a time")
    grads = (case.n + case.v) * case.h * 4
    if chunk_rows is not None:
        allowed = grads + 6 * chunk_rows * case.v * 4
        if report.peak_bytes > allowed:
            raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds dX + dW "
                              f"({format_bytes(grads)}) plus six chunks of logits ({format_bytes(allowed - grads)}): "
                              "free each chunk's tensors before the next chunk")
    return report, grads


def _scratch_allowance(grads: int) -> int:
    """What the fused loss may use beyond dX + dW: 5%, and at these small sizes at least chunk_plan's 1 MiB
    floor plus small per-token vectors."""
    return max(grads // 20, (1 << 20) + (256 << 10))


def check_fused_linear_ce_memory(fused_linear_ce_forward, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    if visible:
        report, grads = _check_no_logits_tensor(fused_linear_ce_forward, "fused_linear_ce_forward",
                                                "the default chunk_plan")
        what = "fused_linear_ce_forward(N=128, H=32, V=3000, fp32, the default chunk_plan)"
        if report.peak_bytes > grads + _scratch_allowance(grads):
            raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds dX + dW "
                              f"({format_bytes(grads)}) plus {format_bytes(_scratch_allowance(grads))} of scratch: "
                              "reuse one tile buffer and overwrite its logits with their gradient")
        used = sorted(set(report.ops) & SOFTMAX_OPS)
        if used:
            raise CheckFailed(f"{what}: PyTorch computed a softmax ({', '.join(used)}): the logsumexp and dlogits "
                              "belong in ce_stats_kernel and ce_grad_kernel")
    if memfit.HAS_GPU:
        half = training_half()
        case = Case(4096, 1024, 32768, ignored=0.1) if visible else Case(2048, 768, 50257, bias=False)
        x, w, t, _ = case.inputs(half, 11)
        grads = (case.n + case.v) * case.h * x.element_size()
        what = f"fused_linear_ce_forward({case.describe(half)}, the default chunk_plan)"
        _, report = measure_peak(lambda: call_learner(fused_linear_ce_forward, x, w, t, what=what),
                                 device=memfit.DEVICE)
        if report.peak_bytes > grads + _scratch_allowance(grads):
            raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds dX + dW "
                              f"({format_bytes(grads)}) + 5%; the logits alone are "
                              f"{format_bytes(case.n * case.v * x.element_size())}")


# ------------------------------------------------------------------- exercise 4: the autograd Function

def check_fused_linear_cross_entropy(fused_linear_cross_entropy, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    plan = ([(Case(40, 16, 300, ignored=0.2), (2, 20), 3.0)] if visible else []) + \
           ([(Case(48, 16, 513, bias=True, smoothing=0.1, softcap=5.0), (4, 3, 4), 0.25)] if hidden else [])
    dtypes = _dtypes(hidden)
    for seed, (case, lead, g) in enumerate(plan):
        dtype = dtypes[-1] if hidden and not visible else torch.float32
        x, w, t, b = case.inputs(dtype, 400 + seed)
        what = (f"fused_linear_cross_entropy({case.describe(dtype)}, x of shape {(*lead, case.h)}, "
                f"backward of {g} x loss)")
        leaves = [None if a is None else a.detach().clone().requires_grad_(True) for a in (x, w, b)]
        loss = call_learner(fused_linear_cross_entropy, leaves[0].view(*lead, case.h), leaves[1], t.view(lead),
                            leaves[2], **case.options(), what=what)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.requires_grad:
            raise CheckFailed(f"{what}: should return a 0-dim loss that autograd can differentiate")
        call_learner((loss * g).backward, what=what + ", backward")
        exact, same = _references(x, w, t, b, case)
        _close(loss.detach().float(), exact[0], same[0].float(), what + ", loss", _loss_floor(dtype, case.v))
        for name, leaf, e, s, terms in (("x.grad", leaves[0], exact[1], same[1], case.v),
                                        ("weight.grad", leaves[1], exact[2], same[2], case.n),
                                        ("bias.grad", leaves[2], exact[3], same[3], case.n)):
            if leaf is None:
                continue
            if leaf.grad is None:
                raise CheckFailed(f"{what}: {name} is None: backward should return the gradient for it")
            _close(leaf.grad, e * g, s * g, f"{what}, {name}", _floor(dtype, terms))
    if visible:
        case = Case(128, 32, 3000, ignored=0.1) if not memfit.HAS_GPU else Case(4096, 1024, 32768, ignored=0.1)
        dtype = training_half() if memfit.HAS_GPU else torch.float32
        x, w, t, _ = case.inputs(dtype, 12)
        x.requires_grad_(True)
        w.requires_grad_(True)
        grads = (case.n + case.v) * case.h * x.element_size()
        what = f"fused_linear_cross_entropy forward + backward of 3 x loss ({case.describe(dtype)})"

        def forward_backward():
            (call_learner(fused_linear_cross_entropy, x, w, t, what=what) * 3).backward()

        # No warm-up call: its gradients would sit in .grad, inside the baseline.
        _, report = measure_peak(lambda: call_learner(forward_backward, what=what), device=memfit.DEVICE,
                                 warmup=False)
        allowed = grads + _scratch_allowance(grads)
        if report.peak_bytes > allowed:
            raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds x.grad + "
                              f"weight.grad ({format_bytes(grads)}) plus {format_bytes(allowed - grads)}: scale "
                              "the saved gradients in place in backward; a copy doubles dW")


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
]
