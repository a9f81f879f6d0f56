"""Checks of lesson 05 (solutions/05_flash_attention.ipynb): the online softmax over a stream of blocks, tiled
attention in PyTorch, the Triton forward and backward, and the memory of forward + backward through autograd.

Numerics follow FlashAttention's rule (autograder/checks/numerics.py): for o, the logsumexp, dq, dk and dv,
the learner's max error against float64 may be at most 2x the error of PyTorch's attention computed in the
same dtype, plus a floor. Outputs are allocated poisoned (NaN), so an element a kernel never writes shows up.
Sequence lengths are not multiples of the tiles. Memory budgets come from the shapes: O(N·d), never N².
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import memfit
from autograder.checks import Check, CheckFailed, KernelSpec, call_learner, check_cases, expect_value_error
from autograder.checks.numerics import (assert_close_by_rule, expect_like, expect_no_torch_arithmetic,
                                        poisoned_allocations, training_half)
from autograder.checks.numerics import case_dtypes as _dtypes, dtype_name as _name, seeded_randn as _randn
from memfit.meter import LIVE_TENSORS, format_bytes, measure_peak


def _qkv(b, h, n, d, dtype, seed, q_scale=1.0):
    return (_randn((b, h, n, d), dtype, seed, q_scale), _randn((b, h, n, d), dtype, seed + 1),
            _randn((b, h, n, d), dtype, seed + 2))


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


def _torch_same(q, k, v, causal):
    """(o, lse) as PyTorch computes them in q's dtype (lse cast to fp32, keeping its error)."""
    return (F.scaled_dot_product_attention(q, k, v, is_causal=causal),
            torch.logsumexp(_scores(q, k, causal), dim=-1).float())


def _expect_pair(got, what: str, names: str):
    if not (isinstance(got, tuple) and len(got) == 2):
        raise CheckFailed(f"{what} should return ({names}), got {type(got).__name__}")
    return got


def _check_lse(lse, q, exact_lse, same_lse, what: str) -> None:
    if not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32 or tuple(lse.shape) != tuple(q.shape[:3]):
        raise CheckFailed(f"{what}: lse should be fp32 of shape {tuple(q.shape[:3])} (one value per query row), got "
                          f"{getattr(lse, 'dtype', type(lse).__name__)} of shape {tuple(getattr(lse, 'shape', ()))}")
    assert_close_by_rule(lse, exact_lse, same_lse, what + ", lse (natural log: m + log l)")


def _describe(b, h, n, d, causal, dtype, q_scale=1.0) -> str:
    large = ", large logits" if q_scale > 1 else ""
    return f"(B={b}, H={h}, N={n}, d={d}, {'causal' if causal else 'not causal'}, {_name(dtype)}{large})"


# Shapes (B, H, N, d, causal, q_scale): lengths are not multiples of any tile; N = 1 has one key. q_scale = 50
# puts scores near 100, where exp overflows unless the running max is subtracted.
VISIBLE = [(1, 2, 1, 16, False, 1.0), (1, 2, 17, 32, True, 1.0), (2, 1, 64, 64, False, 1.0),
           (1, 2, 130, 64, True, 1.0), (1, 1, 40, 32, False, 50.0)]
HIDDEN = [(1, 2, 257, 80, True, 1.0), (1, 1, 100, 96, False, 1.0), (1, 2, 77, 128, True, 1.0),
          (2, 2, 33, 16, False, 1.0), (1, 1, 50, 64, True, 50.0)]
HIDDEN_GPU = [(2, 3, 1000, 64, True, 1.0), (1, 2, 4097, 128, False, 1.0), (1, 2, 2048, 96, True, 1.0)]


def _plan(cases: str):
    visible, hidden = check_cases(cases)
    plan = [(shape, torch.float32) for shape in VISIBLE] if visible else []
    if hidden:
        # Each shape in one dtype, the profile's dtypes in turn (both masks meet every dtype): on a GPU every
        # (dtype, head-dim class, mask) is a kernel to compile, seconds each the first time a machine grades.
        shapes, dtypes = HIDDEN + (HIDDEN_GPU if memfit.HAS_GPU else []), _dtypes(True)
        plan += [(shape, dtypes[(i + 1) % len(dtypes)]) for i, shape in enumerate(shapes)]
    return plan


# ---------------------------------------------------------------------------------- online softmax

def _one_pass(blocks):
    """A generator over the blocks that can be read once (no going back)."""
    yield from blocks


def check_online_softmax(online_softmax_stats, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    plan = []  # (rows, widths of the blocks, offset, -inf pattern)
    if visible:
        plan += [(4, [8, 8, 8, 8, 5], 0.0, None), (3, [100, 100], 500.0, None), (5, [4, 4, 4], 0.0, "first")]
    if hidden:
        plan += [(7, [1] * 13, 0.0, None), (2, [64, 3], -800.0, None), (6, [16, 16, 16, 16], 0.0, "scattered"),
                 (3, [5, 5, 5, 5], 1000.0, "first")]
    for seed, (rows, widths, offset, pattern) in enumerate(plan):
        x = _randn((rows, sum(widths)), torch.float32, seed, scale=4.0) + offset
        if pattern == "first":  # some rows see only -inf in the first blocks (left padding)
            x[::2, : sum(widths[:-1])] = float("-inf")
        elif pattern == "scattered":
            gen = torch.Generator().manual_seed(seed)
            masked = torch.rand(x.shape, generator=gen) < 0.5
            masked[:, -1] = False
            x[masked.to(x.device)] = float("-inf")
        what = f"online_softmax_stats over {rows} rows in blocks of widths {widths}" + (
            f", values near {offset:g}" if offset else "") + (f", -inf entries ({pattern})" if pattern else "")
        got = _expect_pair(call_learner(online_softmax_stats, _one_pass(list(x.split(widths, dim=1))), what=what),
                           what, "m, l")
        m, l = got
        exact_m = x.double().amax(dim=1)
        expect_like(m, exact_m.float(), what + ", m")
        if not torch.equal(m.double(), exact_m):
            bad = int((m.double() != exact_m).nonzero()[0])
            raise CheckFailed(f"{what}: m should be each row's maximum; row {bad}: expected {exact_m[bad].item():g}, "
                              f"got {m[bad].item():g}")
        exact_l = torch.exp(x.double() - exact_m[:, None]).sum(dim=1)
        same_l = torch.exp(x - x.amax(dim=1, keepdim=True)).sum(dim=1)
        assert_close_by_rule(l, exact_l, same_l, what + ", l (the sum of exp(x - m))")


# ---------------------------------------------------------------------------------- tiled attention

def check_attention_tiled(attention_tiled, cases: str = "visible") -> None:
    visible, _ = check_cases(cases)
    tiles = [(16, 8), (8, 16), (32, 32), (64, 64), (16, 16)]
    plan = [(shape, dtype) for shape, dtype in _plan(cases) if shape[2] <= 1000]
    for seed, ((b, h, n, d, causal, q_scale), dtype) in enumerate(plan):
        block_m, block_n = tiles[seed % len(tiles)]
        q, k, v = _qkv(b, h, n, d, dtype, 10 * seed, q_scale)
        what = (f"attention_tiled{_describe(b, h, n, d, causal, dtype, q_scale)} with block_m={block_m}, "
                f"block_n={block_n}")
        o, lse = _expect_pair(call_learner(attention_tiled, q, k, v, causal, block_m, block_n, what=what), what,
                              "o, lse")
        exact_o, exact_lse = _exact(q, k, v, causal)
        same_o, same_lse = _torch_same(q, k, v, causal)
        assert_close_by_rule(o, exact_o, same_o, what + ", o")
        _check_lse(lse, q, exact_lse, same_lse, what)
    if visible:
        b, h, n, d, block = 1, 2, (2048 if memfit.HAS_GPU else 512), 32, 64
        q, k, v = _qkv(b, h, n, d, torch.float32, 99)
        what = f"attention_tiled(B={b}, H={h}, N={n}, d={d}, fp32, block_m=block_n={block})"
        _, report = measure_peak(lambda: call_learner(attention_tiled, q, k, v, True, block, block, what=what),
                                 device=memfit.DEVICE, warmup=False)
        outputs = b * h * n * (d + 1) * 4
        tile_work = 8 * b * h * (block * block + 2 * block * d) * 4
        if report.peak_bytes > outputs + tile_work:
            raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds o and lse "
                              f"({format_bytes(outputs)}) plus a few tiles ({format_bytes(tile_work)}); the full "
                              f"score matrix alone is {format_bytes(b * h * n * n * 4)}: keep S and P to one "
                              "(block_m x block_n) tile at a time")


# ------------------------------------------------------------------------------------- Triton forward

def check_flash_forward(flash_attention_forward, cases: str = "visible") -> None:
    visible, _ = check_cases(cases)
    for seed, ((b, h, n, d, causal, q_scale), dtype) in enumerate(_plan(cases)):
        q, k, v = _qkv(b, h, n, d, dtype, 10 * seed, q_scale)
        what = f"flash_attention_forward{_describe(b, h, n, d, causal, dtype, q_scale)}"
        with poisoned_allocations():
            got = call_learner(flash_attention_forward, q, k, v, causal, what=what)
        o, lse = _expect_pair(got, what, "o, lse")
        exact_o, exact_lse = _exact(q, k, v, causal)
        same_o, same_lse = _torch_same(q, k, v, causal)
        assert_close_by_rule(o, exact_o, same_o, what + ", o")
        _check_lse(lse, q, exact_lse, same_lse, what)
    if visible:
        q, k, v = _qkv(1, 2, 20, 32, torch.float32, 5)
        expect_value_error(flash_attention_forward, q, k[:, :, :-1], v,
                           what="flash_attention_forward with k shorter than q", why="naming the shapes")
        expect_value_error(flash_attention_forward, q, k, v.half(),
                           what="flash_attention_forward with v in fp16 and q, k in fp32", why="naming the dtypes")
        wide = _randn((1, 1, 4, 256), torch.float32, 6)
        expect_value_error(flash_attention_forward, wide, wide, wide,
                           what="flash_attention_forward with head_dim 256", why="naming the head dim limit")


def _memory_shape():
    return (1, 2, 2048, 64) if memfit.HAS_GPU else (1, 2, 256, 64)


def check_flash_forward_memory(flash_attention_forward, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    b, h, n, d = _memory_shape()
    plan = ([(torch.float32, True)] if visible else []) + ([(training_half(), False)] if hidden else [])
    for dtype, causal in plan:
        q, k, v = _qkv(b, h, n, d, dtype, 21)
        what = f"flash_attention_forward{_describe(b, h, n, d, causal, dtype)}"
        (o, lse), report = measure_peak(lambda: call_learner(flash_attention_forward, q, k, v, causal, what=what),
                                        device=memfit.DEVICE)
        budget = math.ceil(1.05 * (q.numel() * q.element_size() + b * h * n * 4))
        if report.peak_bytes > budget:
            raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds o and lse "
                              f"({format_bytes(budget)} with 5%); the scores alone would be "
                              f"{format_bytes(b * h * n * n * 4)}: keep every tile in the kernel")
        _, report = measure_peak(lambda: call_learner(flash_attention_forward, q, k, v, causal, what=what),
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


def check_flash_backward(flash_attention_backward, cases: str = "visible") -> None:
    visible, _ = check_cases(cases)
    for seed, ((b, h, n, d, causal, q_scale), dtype) in enumerate(_plan(cases)):
        # Backward exponentiates S - lse <= 0 whatever the logits: no overflow to provoke. Logits near 100 only
        # make fp32 gradients ill-conditioned (PyTorch's own error is then noise), so peaked but moderate ones.
        q_scale = min(q_scale, 4.0)
        q, k, v = _qkv(b, h, n, d, dtype, 10 * seed, q_scale)
        do = _randn((b, h, n, d), dtype, 10 * seed + 7)
        exact_o, exact_lse = _exact(q, k, v, causal)
        o, lse = exact_o.to(dtype), exact_lse.float()
        what = f"flash_attention_backward{_describe(b, h, n, d, causal, dtype, q_scale)}"
        with poisoned_allocations():
            got = call_learner(flash_attention_backward, do, q, k, v, o, lse, causal, what=what)
        if not (isinstance(got, tuple) and len(got) == 3):
            raise CheckFailed(f"{what} should return (dq, dk, dv), got {type(got).__name__}")
        exact, same = _exact_and_same_grads(q, k, v, do, causal)
        for name, mine, e, s in zip(("dq", "dk", "dv"), got, exact, same):
            assert_close_by_rule(mine, e, s, f"{what}, {name}", floor_ulps=_gradient_floor_ulps(dtype, n))
    if visible:
        b, h, n, d = _memory_shape()
        for causal in (False, True):
            q, k, v = _qkv(b, h, n, d, torch.float32, 31)
            do = _randn((b, h, n, d), torch.float32, 32)
            exact_o, exact_lse = _exact(q, k, v, causal)
            o, lse = exact_o.float(), exact_lse.float()
            what = f"flash_attention_backward{_describe(b, h, n, d, causal, torch.float32)}"
            _, report = measure_peak(
                lambda: call_learner(flash_attention_backward, do, q, k, v, o, lse, causal, what=what),
                device=memfit.DEVICE)
            budget = math.ceil(1.05 * (3 * q.numel() * 4 + b * h * n * 4))
            if report.peak_bytes > budget:
                raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds dq, dk, dv "
                                  f"and one fp32 delta per row ({format_bytes(budget)} with 5%): recompute P in the "
                                  "kernels, and compute delta = rowsum(do * o) in a kernel too")
            _, report = measure_peak(
                lambda: call_learner(flash_attention_backward, do, q, k, v, o, lse, causal, what=what),
                device=memfit.DEVICE, meter=LIVE_TENSORS, warmup=False)
            expect_no_torch_arithmetic(report.ops, what, "delta and the gradients belong in your Triton kernels")


# ------------------------------------------------------------------------ autograd: numerics and memory

def check_flash_attention_memory(flash_attention, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    # Through autograd, in a transformer's layout: (B, N, H, d) projections viewed as (B, H, N, d).
    layouts = ([(1, 40, 2, 32, True, torch.float32)] if visible else []) + \
              ([(2, 70, 3, 64, False, dtype) for dtype in _dtypes(True)] if hidden else [])
    for seed, (b, n, h, d, causal, dtype) in enumerate(layouts):
        q, k, v = (_randn((b, n, h, d), dtype, 40 + 3 * seed + i).transpose(1, 2) for i in range(3))
        do = _randn((b, h, n, d), dtype, 50 + seed)
        what = f"flash_attention{_describe(b, h, n, d, causal, dtype)} on transposed (B, N, H, d) inputs"
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = call_learner(flash_attention, *leaves, causal, what=what)
        exact_o, _ = _exact(q, k, v, causal)
        assert_close_by_rule(out, exact_o, F.scaled_dot_product_attention(q, k, v, is_causal=causal), what + ", o")
        call_learner(out.backward, do, what=what + ", backward")
        exact, same = _exact_and_same_grads(q, k, v, do, causal)
        for name, leaf, e, s in zip(("q.grad", "k.grad", "v.grad"), leaves, exact, same):
            assert_close_by_rule(leaf.grad, e, s, f"{what}, {name}", floor_ulps=_gradient_floor_ulps(dtype, n))
    b, h, n, d = (1, 16, 4096, 64) if memfit.HAS_GPU else (1, 2, 512, 32)
    plan = ([(torch.float32 if not memfit.HAS_GPU else training_half(), True)] if visible else []) + \
           ([(torch.float32, False)] if hidden else [])
    for dtype, causal in plan:
        q, k, v = (_randn((b, h, n, d), dtype, 60 + i).requires_grad_(True) for i in range(3))
        do = _randn((b, h, n, d), dtype, 63)
        what = f"flash_attention forward + backward{_describe(b, h, n, d, causal, dtype)}"

        def forward_backward():
            call_learner(flash_attention, q, k, v, causal, what=what).backward(do)

        # No warm-up call: its gradients would sit in .grad, inside the baseline.
        _, report = measure_peak(lambda: call_learner(forward_backward, what=what), device=memfit.DEVICE,
                                 warmup=False)
        tensor = q.numel() * q.element_size()
        budget = math.ceil(1.05 * (4 * tensor + 2 * b * h * n * 4))  # o, dq, dk, dv; lse and delta in fp32
        if report.peak_bytes > budget:
            raise CheckFailed(
                f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds o, lse, delta, dq, dk, dv "
                f"({format_bytes(budget)} with 5%); naive attention would keep "
                f"{format_bytes(b * h * n * n * q.element_size())} for P alone: save only q, k, v, o and lse")


# On a GPU the first grading run compiles every kernel variant the cases need (a few seconds each, minutes
# in all on a 2-core Colab machine); later runs load them from Triton's cache. Hence the long timeouts.
CHECKS = [
    Check("online_softmax", 2, check_online_softmax, uses=("online_softmax_stats",)),
    Check("attention_tiled", 3, check_attention_tiled, uses=("attention_tiled",)),
    Check("flash_forward", 3, check_flash_forward, uses=("flash_attention_forward",), timeout_s=600),
    Check("flash_forward_memory", 1, check_flash_forward_memory, uses=("flash_attention_forward",)),
    Check("flash_backward", 4, check_flash_backward, uses=("flash_attention_backward",), timeout_s=600),
    Check("flash_attention_memory", 2, check_flash_attention_memory, uses=("flash_attention",), timeout_s=600),
]

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
