"""Checks of lesson 04 (solutions/04_kernel_fusion.ipynb): a fused a**4, RMSNorm forward and backward, SwiGLU
forward and backward, drop-in modules that train the course GPT as eager PyTorch does, and the activation
bytes fusion saves.

Numerics follow the course's rule (autograder/checks/numerics.py): the learner's error against float64 may be
at most 2x PyTorch's error computing the same thing in the same dtype, plus a floor. Gradients are compared
with autograd through the eager formula in float64. Memory budgets come from the outputs' shapes.
"""
from __future__ import annotations

import copy
import math

import torch

import memfit
from autograder.checks import Check, CheckFailed, KernelSpec, NotImplementedYet, call_learner, check_cases
from autograder.checks.numerics import GUARD_ELEMENTS, assert_close_by_rule, expect_like, expect_no_torch_arithmetic
from autograder.checks.numerics import case_dtypes as _dtypes, dtype_name as _name, seeded_randn as _randn
from memfit.gpt import rms_norm, swiglu
from memfit.meter import LIVE_TENSORS, format_bytes, measure_peak


def _no_torch_arithmetic(fn, what: str) -> None:
    _, report = measure_peak(fn, device=memfit.DEVICE, meter=LIVE_TENSORS, warmup=False)
    expect_no_torch_arithmetic(report.ops, what)


# --------------------------------------------------------------------------------------------- pow4

def check_pow4_numerics(pow4, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    sizes = ([1, 17, 1000] if visible else []) + ([1023, 1024, 1025, 4097, 65_537] if hidden else [])
    for seed, n in enumerate(sizes):
        for dtype in _dtypes(hidden):
            a = _randn(n, dtype, seed, scale=1.5)
            what = f"pow4(a) with n={n}, {_name(dtype)}"
            exact = a.double() ** 4
            torch_same = a * a * a * a
            buffer = torch.full((n + GUARD_ELEMENTS,), float("nan"), dtype=dtype, device=a.device)
            out = buffer[:n]
            got = call_learner(pow4, a, out=out, what=what + " and out=")
            if got is not out:
                raise CheckFailed(f"{what}: with out= given, pow4 must write into it and return it")
            assert_close_by_rule(out, exact, torch_same, what + " (into out=)")
            spill = ~torch.isnan(buffer[n:])
            if spill.any():
                raise CheckFailed(f"{what}: wrote {int(spill.sum())} elements past the end of out: mask the store")
            assert_close_by_rule(call_learner(pow4, a, what=what), exact, torch_same, what)


def check_pow4_memory(pow4, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    for n, dtype in ([(4097, torch.float32)] if visible else []) + ([(1 << 18, torch.float16)] if hidden else []):
        a = _randn(n, dtype, 7)
        what = f"pow4 at n={n:,}, {_name(dtype)}"
        out, report = measure_peak(lambda: call_learner(pow4, a, what=what), device=memfit.DEVICE)
        expect_like(out, a, what)
        budget = math.ceil(1.05 * out.numel() * out.element_size())
        if report.peak_bytes > budget:
            raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds the output's "
                              f"{format_bytes(budget)} (+5%): a fused kernel allocates no temporaries")
        _no_torch_arithmetic(lambda: call_learner(pow4, a, what=what), what)


# ------------------------------------------------------------------------------------------ RMSNorm

EPS = 1e-5


def _rmsnorm_eager(x, w):
    return rms_norm(x, w, EPS)


def _rms_cases(visible: bool, hidden: bool):
    cases = []
    if visible:
        cases += [((4, 128), torch.float32), ((3, 5, 100), torch.float32), ((1, 1), torch.float32)]
    if hidden:
        cases += [((n, h), dtype) for n, h in ((1, 4096), (37, 1000), (64, 257), (5, 3000))
                  for dtype in _dtypes(True)]
    return cases


def check_rmsnorm_forward(rmsnorm_forward, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    for seed, (shape, dtype) in enumerate(_rms_cases(visible, hidden)):
        x = _randn(shape, dtype, seed, scale=2.0)
        w = _randn(shape[-1], dtype, seed + 100) + 1
        what = f"rmsnorm_forward(x of shape {shape}, {_name(dtype)})"
        got = call_learner(rmsnorm_forward, x, w, EPS, what=what)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise CheckFailed(f"{what} should return (y, rstd), got {type(got).__name__}")
        y, rstd = got
        exact_rstd = torch.rsqrt(x.double().pow(2).mean(-1) + EPS).reshape(-1)
        assert_close_by_rule(y, _rmsnorm_eager(x.double(), w.double()), _rmsnorm_eager(x, w), what + ", y")
        if not isinstance(rstd, torch.Tensor) or rstd.dtype != torch.float32 or rstd.numel() != exact_rstd.numel():
            raise CheckFailed(f"{what}: rstd should be fp32 with one value per row ({exact_rstd.numel()}), got "
                              f"{getattr(rstd, 'dtype', type(rstd))} with {getattr(rstd, 'numel', lambda: '?')()} "
                              "values")
        torch_rstd = torch.rsqrt(x.float().pow(2).mean(-1) + EPS).reshape(-1)
        assert_close_by_rule(rstd.reshape(-1), exact_rstd, torch_rstd, what + ", rstd")
    x = _randn((64, 1000), torch.float32, 1)
    w = _randn(1000, torch.float32, 2)
    what = "rmsnorm_forward on 64 rows of 1000 (fp32)"
    (y, rstd), report = measure_peak(lambda: call_learner(rmsnorm_forward, x, w, EPS, what=what), device=memfit.DEVICE)
    budget = math.ceil(1.05 * (y.numel() * y.element_size() + rstd.numel() * 4))
    if report.peak_bytes > budget:
        raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds y + rstd "
                          f"({format_bytes(budget)} with 5%): keep the row in registers, allocate nothing else")
    _no_torch_arithmetic(lambda: call_learner(rmsnorm_forward, x, w, EPS, what=what), what)


def check_rmsnorm_backward(rmsnorm_forward, rmsnorm_backward, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    for seed, (shape, dtype) in enumerate(_rms_cases(visible, hidden)):
        x = _randn(shape, dtype, seed, scale=2.0)
        w = _randn(shape[-1], dtype, seed + 100) + 1
        dy = _randn(shape, dtype, seed + 200)
        what = f"rmsnorm_backward(x of shape {shape}, {_name(dtype)})"
        _, rstd = call_learner(rmsnorm_forward, x, w, EPS, what=what.replace("backward", "forward"))
        got = call_learner(rmsnorm_backward, dy, x, w, rstd, what=what)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise CheckFailed(f"{what} should return (dx, dweight), got {type(got).__name__}")
        dx, dw = got
        exact, same = [], []
        for precision in (torch.float64, None):
            xi = (x.double() if precision else x).detach().requires_grad_(True)
            wi = (w.double() if precision else w).detach().requires_grad_(True)
            _rmsnorm_eager(xi, wi).backward(dy.double() if precision else dy)
            (exact if precision else same).extend([xi.grad, wi.grad])
        assert_close_by_rule(dx, exact[0], same[0], what + ", dx")
        assert_close_by_rule(dw, exact[1], same[1], what + ", dweight (summed over all rows)")


# ------------------------------------------------------------------------------------------- SwiGLU

def check_swiglu(swiglu_forward, swiglu_backward, cases: str = "visible") -> None:
    visible, hidden = check_cases(cases)
    shapes = ([(4, 64), (3, 5, 100)] if visible else []) + ([(1, 1), (37, 1000), (2, 3, 2100)] if hidden else [])
    for seed, shape in enumerate(shapes):
        for dtype in _dtypes(hidden):
            gate_up = _randn(shape[:-1] + (2 * shape[-1],), dtype, seed, scale=3.0)
            gate, up = gate_up.chunk(2, dim=-1)  # views into one tensor, as the GPT's w13 output
            what = f"swiglu on gate and up of shape {shape} (halves of one tensor), {_name(dtype)}"
            h = call_learner(swiglu_forward, gate, up, what="swiglu_forward: " + what)
            assert_close_by_rule(h, swiglu(gate.double(), up.double()), swiglu(gate, up),
                                 "swiglu_forward: " + what)
            dh = _randn(shape, dtype, seed + 50)
            got = call_learner(swiglu_backward, dh, gate, up, what="swiglu_backward: " + what)
            if not isinstance(got, torch.Tensor) or got.shape != gate_up.shape:
                raise CheckFailed(f"swiglu_backward: {what} should return one tensor of shape {tuple(gate_up.shape)} "
                                  f"([dgate | dup]), got {getattr(got, 'shape', type(got).__name__)}")
            got = got.chunk(2, dim=-1)
            grads = {}
            for key, (g, u, d) in (("exact", (gate.double(), up.double(), dh.double())), ("same", (gate, up, dh))):
                g, u = g.detach().clone().requires_grad_(True), u.detach().clone().requires_grad_(True)
                swiglu(g, u).backward(d)
                grads[key] = (g.grad, u.grad)
            assert_close_by_rule(got[0], grads["exact"][0], grads["same"][0], "swiglu_backward: " + what + ", dgate")
            assert_close_by_rule(got[1], grads["exact"][1], grads["same"][1], "swiglu_backward: " + what + ", dup")
    gate_up = _randn((64, 2 * 1000), torch.float32, 9)
    gate, up = gate_up.chunk(2, dim=-1)
    dh = _randn((64, 1000), torch.float32, 10)
    what = "swiglu_backward on 64 x 1000 (fp32)"
    got, report = measure_peak(lambda: call_learner(swiglu_backward, dh, gate, up, what=what), device=memfit.DEVICE)
    budget = math.ceil(1.05 * 2 * dh.numel() * 4)
    if report.peak_bytes > budget:
        raise CheckFailed(f"{what}: peak extra memory {format_bytes(report.peak_bytes)} exceeds [dgate | dup] "
                          f"({format_bytes(budget)} with 5%): recompute silu inside the kernel, store nothing else")
    _no_torch_arithmetic(lambda: call_learner(swiglu_forward, gate, up, what=what), "swiglu_forward " + what)


# ------------------------------------------------------------------------------------ the fused GPT

def _train(model, cfg, steps: int, seed_base: int) -> list[float]:
    from memfit.training import random_batch
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        idx, targets = random_batch(cfg, 2, 16, memfit.DEVICE, seed=seed_base + step % 3)
        loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def check_fused_gpt(use_fused_kernels, cases: str = "visible") -> None:
    from memfit.gpt import COURSE_CONFIGS, GPT, RMSNorm, SwiGLU
    from memfit.training import random_batch
    visible, hidden = check_cases(cases)
    plan = (["tiny"] if visible else []) + (["tiny-mha"] if hidden else [])
    for name in plan:
        cfg = COURSE_CONFIGS[name]
        torch.manual_seed(0)
        eager = GPT(cfg).to(memfit.DEVICE)
        fused = call_learner(use_fused_kernels, copy.deepcopy(eager), what="use_fused_kernels(model)")
        if not isinstance(fused, torch.nn.Module):
            raise CheckFailed(f"use_fused_kernels should return the model, got {type(fused).__name__}")
        kinds = [type(m) for m in fused.modules()]
        if RMSNorm in kinds or SwiGLU in kinds:
            raise CheckFailed(f"course-{name}: after use_fused_kernels the model still has eager "
                              f"{'RMSNorm' if RMSNorm in kinds else 'SwiGLU'} modules")
        # Gradients of one step, parameter by parameter.
        idx, targets = random_batch(cfg, 2, 16, memfit.DEVICE, seed=99)
        eager(idx, targets).backward()
        try:
            loss = call_learner(lambda: fused(idx, targets), what=f"the fused course-{name} forward")
            call_learner(loss.backward, what=f"the fused course-{name} backward")
        except NotImplementedYet:
            raise NotImplementedYet("the fused modules call your kernels (rmsnorm_forward, rmsnorm_backward, "
                                    "swiglu_forward, swiglu_backward), and one is not implemented yet") from None
        for (pname, p), q in zip(eager.named_parameters(), fused.parameters()):
            if q.grad is None:
                raise CheckFailed(f"course-{name}: {pname} got no gradient through the fused modules")
            err = ((q.grad - p.grad).abs().max() / p.grad.abs().max().clamp_min(1e-12)).item()
            if err > 1e-4:
                raise CheckFailed(f"course-{name}: the gradient of {pname} differs from eager PyTorch by {err:.1e} "
                                  "(relative to its largest entry; allowed 1e-4)")
        eager.zero_grad(set_to_none=True)
        fused.zero_grad(set_to_none=True)
        steps = 12
        a, b = _train(eager, cfg, steps, 0), _train(fused, cfg, steps, 0)
        worst = max(range(steps), key=lambda i: abs(a[i] - b[i]))
        if abs(a[worst] - b[worst]) > 1e-3 * abs(a[worst]):
            raise CheckFailed(f"course-{name}: the loss curves part at step {worst}: eager {a[worst]:.5f}, fused "
                              f"{b[worst]:.5f} (allowed 0.1%)")


# ------------------------------------------------------------------------------------ savings

def measured_savings(cfg, batch: int, seq: int, dtype: torch.dtype, use_fused_kernels) -> int:
    """Activation bytes autograd saves in block 0, eager minus fused (memfit.training.saved_tensors)."""
    from memfit.gpt import GPT
    from memfit.training import random_batch, saved_tensors
    torch.manual_seed(0)
    eager = GPT(cfg).to(device=memfit.DEVICE, dtype=dtype)
    fused = use_fused_kernels(copy.deepcopy(eager))
    idx, targets = random_batch(cfg, batch, seq, memfit.DEVICE, seed=0)
    kept = []
    for model in (eager, fused):
        saved = saved_tensors(model, idx, targets)
        kept.append(sum(s.nbytes for s in saved if s.module.startswith("blocks.0") and s.kind == "activation"))
    return kept[0] - kept[1]


def check_fusion_savings(fusion_savings_per_layer, use_fused_kernels, cases: str = "visible") -> None:
    """The learner's formula against the bytes the memory meter sees fusion save in a forward pass. The savings
    are measured with the reference use_fused_kernels, not the learner's: this check grades the formula alone,
    so a broken fused GPT loses fused_gpt's points and not these too."""
    from memfit.from_lessons.kernel_fusion import use_fused_kernels as reference_fuse
    from memfit.gpt import COURSE_CONFIGS
    visible, hidden = check_cases(cases)
    plan = ([("tiny", 2, 16, torch.float32)] if visible else []) + \
           ([("tiny", 3, 20, torch.float16), ("tiny-mha", 2, 16, torch.float32), ("tiny-mha", 1, 33, torch.float16)]
            if hidden else [])
    for name, batch, seq, dtype in plan:
        cfg = COURSE_CONFIGS[name]
        want = measured_savings(cfg, batch, seq, dtype, reference_fuse)
        nbytes = torch.empty((), dtype=dtype).element_size()
        what = f"fusion_savings_per_layer(course-{name}, batch={batch}, seq={seq}, dtype_bytes={nbytes})"
        got = call_learner(fusion_savings_per_layer, cfg, batch, seq, nbytes, what=what)
        if got != want:
            tokens = batch * seq
            raise CheckFailed(f"{what}: measured {want:,} bytes saved per layer ({want / tokens:g} per token), "
                              f"you returned {got!r}")


CHECKS = [
    Check("pow4_numerics", 2, check_pow4_numerics, uses=("pow4",)),
    Check("pow4_memory", 1, check_pow4_memory, uses=("pow4",)),
    Check("rmsnorm_forward", 2, check_rmsnorm_forward, uses=("rmsnorm_forward",)),
    Check("rmsnorm_backward", 3, check_rmsnorm_backward, uses=("rmsnorm_forward", "rmsnorm_backward")),
    Check("swiglu", 3, check_swiglu, uses=("swiglu_forward", "swiglu_backward")),
    Check("fused_gpt", 2, check_fused_gpt, uses=("use_fused_kernels",), timeout_s=300),
    Check("fusion_savings", 2, check_fusion_savings, uses=("fusion_savings_per_layer", "use_fused_kernels")),
]

KERNELS = [
    KernelSpec("pow4_kernel", "pow4", {"a_ptr": "*{dtype}", "b_ptr": "*{dtype}", "n": "i32"}),
    KernelSpec("rmsnorm_forward_kernel", "rmsnorm",
               {"x_ptr": "*{dtype}", "w_ptr": "*{dtype}", "y_ptr": "*{dtype}", "rstd_ptr": "*fp32", "stride": "i32",
                "n_cols": "i32", "eps": "fp32"}),
    KernelSpec("rmsnorm_backward_kernel", "rmsnorm",
               {"dy_ptr": "*{dtype}", "x_ptr": "*{dtype}", "w_ptr": "*{dtype}", "rstd_ptr": "*fp32", "dx_ptr": "*{dtype}",
                "dw_ptr": "*fp32", "stride": "i32", "n_rows": "i32", "n_cols": "i32", "rows_per_program": "i32"}),
    KernelSpec("swiglu_forward_kernel", "swiglu",
               {"g_ptr": "*{dtype}", "u_ptr": "*{dtype}", "h_ptr": "*{dtype}", "stride_g": "i32", "stride_u": "i32",
                "n_cols": "i32"}),
    KernelSpec("swiglu_backward_kernel", "swiglu",
               {"dh_ptr": "*{dtype}", "g_ptr": "*{dtype}", "u_ptr": "*{dtype}", "d_ptr": "*{dtype}",
                "stride_g": "i32", "stride_u": "i32", "n_cols": "i32"}),
]
