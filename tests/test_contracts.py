"""The contracts of autograder/checks/contracts.py, through the checks as they are: a wrong implementation of each
kind, made generically from the reference (no case written for it), loses the check's points through the shared
harness; the reference keeps them; a rerun decides the same."""
import functools
import weakref

import pytest
import torch

import memfit  # (sets TRITON_INTERPRET on a machine without a GPU, before triton is imported)
import triton
import triton.language as tl

from autograder.checks import CheckFailed, checks_for, contracts
from course.notebook_loader import load_solution

# (lesson, check): checks whose learner functions take plain arguments (tensors, numbers, configs)
PLAIN_CHECKS = [("00_first_kernel", "bytes_of"), ("00_first_kernel", "scaled_add_numerics"),
                ("01_model_states", "count_params"), ("01_model_states", "state_bytes"),
                ("02_activations", "activation_bytes"), ("02_activations", "predict_peak"),
                ("06_fused_linear_ce", "cross_entropy_with_grad"), ("07_quantization", "q8_0")]


def _check(lesson, name):
    return next(c for c in checks_for(lesson) if c.name == name)


def _shape_key(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, (tuple, list)):
        return tuple(_shape_key(v) for v in value)
    return type(value).__name__  # every number, string or config alike: the key forgets the values


def memo_by_shape(fn):
    """Wrong: remembers its first result per argument shapes and types, whatever the values."""
    memo = {}

    @functools.wraps(fn)
    def wrong(*args, **kwargs):
        key = _shape_key((args, tuple(sorted(kwargs.items()))))
        if key not in memo:
            memo[key] = fn(*args, **kwargs)
        return memo[key]
    return wrong


def returns_float(fn):
    """Wrong: the right numbers, as floats where the signature says int."""
    @functools.wraps(fn)
    def wrong(*args, **kwargs):
        result = fn(*args, **kwargs)
        if isinstance(result, dict):
            return {k: float(v) if type(v) is int else v for k, v in result.items()}
        return float(result) if type(result) is int else result
    return wrong


def _run(lesson, name, wrap=None):
    contracts.new_check()  # as the grader does before each check
    ref = load_solution(lesson)
    check = _check(lesson, name)
    fns = [getattr(ref, n) for n in check.uses]
    if wrap:
        fns = [wrap(f) for f in fns]
    check.run(*fns, cases="visible")


@pytest.mark.parametrize("lesson,name", PLAIN_CHECKS)
def test_a_result_kept_between_calls_loses_the_points(lesson, name):
    _run(lesson, name)  # the reference keeps them
    with pytest.raises(CheckFailed):
        _run(lesson, name, memo_by_shape)


def _declares_int(lesson, name) -> bool:
    import ast
    declared = [contracts.DECLARED_RETURNS.get(use) for use in _check(lesson, name).uses]
    return all(d is not None and "int" in ast.unparse(d) for d in declared)


@pytest.mark.parametrize("lesson,name", [(l, n) for l, n in PLAIN_CHECKS if _declares_int(l, n)])
def test_a_float_where_the_signature_says_int_loses_the_points(lesson, name):
    with pytest.raises(CheckFailed, match="where int is declared"):
        _run(lesson, name, returns_float)


def test_a_shared_result_loses_the_points():
    ref = load_solution("01_model_states")
    shared = {}

    def state_bytes(n_params, precision="amp", optimizer="adamw"):
        shared.clear()
        shared.update(ref.state_bytes(n_params, precision, optimizer))
        return shared

    with pytest.raises(CheckFailed, match="an earlier call"):
        _check("01_model_states", "state_bytes").run(state_bytes, cases="visible")


def test_a_graph_on_a_result_without_autograd_loses_the_points():
    ref = load_solution("06_fused_linear_ce")

    def cross_entropy_with_grad(logits, targets, *args, **kwargs):
        loss, grad = ref.cross_entropy_with_grad(logits, targets, *args, **kwargs)
        return loss + 0 * logits.detach().clone().requires_grad_().sum(), grad

    with pytest.raises(CheckFailed, match="requires grad"):
        _check("06_fused_linear_ce", "cross_entropy_with_grad").run(cross_entropy_with_grad, cases="visible")


def test_decoys_are_the_same_on_a_rerun():
    """Which calls get decoys depends on the function's names and the calls' signatures, never on addresses."""
    ref = load_solution("00_first_kernel")
    saved = contracts._decoyed
    try:
        made = []
        for _ in range(2):
            _run("00_first_kernel", "bytes_of")
            made.append(sorted(map(str, contracts._decoyed.items())))
        assert made[0] == made[1] and made[0]
    finally:
        contracts._decoyed = saved
    assert ref.bytes_of((2, 3), torch.float32) == 24


# The load watch (numerics.loads_in_bounds, around every call of learner code in Triton's interpreter): a kernel that
# reads its tensors through a table of pointers (one launch for many tensors: lesson 07's fused optimizer step) reads
# inside them, and keeps its points; the same kernel reading past a tabled tensor's end does not.


@triton.jit
def _sum_through_table(table_ptr, sizes_ptr, out_ptr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    src = tl.load(table_ptr + t).to(tl.pointer_type(tl.float32))
    offs = tl.arange(0, BLOCK)
    values = tl.load(src + offs, mask=offs < tl.load(sizes_ptr + t), other=0.0)
    tl.store(out_ptr + t, tl.sum(values, axis=0))


def _sums_through_table(tensors, sizes):
    table = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)
    out = torch.empty(len(tensors))
    _sum_through_table[(len(tensors),)](table, torch.tensor(sizes, dtype=torch.int32), out, BLOCK=64)
    return out


@pytest.mark.skipif(not memfit.INTERPRETED, reason="the watch runs in Triton's interpreter (a machine without a GPU)")
def test_the_load_watch_lets_a_pointer_table_read_its_tensors_and_nothing_past_their_ends():
    from autograder.checks.numerics import loads_in_bounds
    tensors = [torch.randn(40), torch.randn(13)]
    with loads_in_bounds("sums"):
        got = _sums_through_table(tensors, [40, 13])
    torch.testing.assert_close(got, torch.stack([t.sum() for t in tensors]))
    with pytest.raises(CheckFailed, match="outside every tensor"):
        with loads_in_bounds("sums"):
            _sums_through_table(tensors, [40, 20])  # 7 elements past the second tensor's end


def through_numpy(copy_first: bool):
    """Each positional tensor argument goes through NumPy before the reference sees it: `.numpy()` on the tensor itself, which a
    CUDA tensor refuses (wrong: valid on a CPU only), or on the copy `.cpu()` makes (right on any machine)."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            def host(a):
                if isinstance(a, torch.Tensor) and a.dtype in (torch.float32, torch.float16) and a.numel() \
                        and a.is_contiguous():  # (a strided view is handed on: its layout is part of the case)
                    return torch.from_numpy((a.cpu() if copy_first else a).detach().numpy())
                return a
            return fn(*map(host, args), **kwargs)  # (an out= keeps its identity: the result is written there)
        return run
    return wrap


@pytest.mark.skipif(not memfit.INTERPRETED, reason="on a GPU the tensors are CUDA tensors: PyTorch refuses it there")
@pytest.mark.parametrize("lesson,name", [("00_first_kernel", "scaled_add_numerics"),
                                         ("04_kernel_fusion", "rmsnorm_forward"), ("07_quantization", "q8_0")])
def test_an_argument_turned_into_numpy_loses_the_points_and_a_copy_of_it_does_not(lesson, name):
    _run(lesson, name, through_numpy(copy_first=True))
    with pytest.raises(CheckFailed, match="can't convert a tensor the check handed you to NumPy"):
        _run(lesson, name, through_numpy(copy_first=False))


_KEPT: dict = {}


def _reuses_its_buffer(x):
    """Wrong: writes each result into the buffer it returned last time (a weak cache: the caller's reference is what
    keeps it), so a second call overwrites the first call's result."""
    ref = _KEPT.get(tuple(x.shape))
    out = ref() if ref is not None else None
    if out is None:
        out = torch.empty_like(x)
        _KEPT[tuple(x.shape)] = weakref.ref(out)
    return torch.mul(x, 2.0, out=out)


def test_a_result_an_earlier_call_returned_and_the_caller_holds_loses_the_points_under_a_meter_too():
    from autograder.checks import call_learner
    from memfit.meter import measure_peak
    contracts.new_check()
    x = torch.randn(64)
    first, _ = measure_peak(lambda: call_learner(_reuses_its_buffer, x, what="twice"), device="cpu")
    with pytest.raises(CheckFailed, match="an earlier call .* returned too"):
        measure_peak(lambda: call_learner(_reuses_its_buffer, x * 3, what="twice"), device="cpu")
    del first
    contracts.new_check()  # a new check, or the first result dropped: nothing to compare with
    measure_peak(lambda: call_learner(_reuses_its_buffer, x, what="twice"), device="cpu")


# ----------------------------------------------------------------------- 5. tensors for backward: save_for_backward

def keeps_a_tensor_on_ctx(function_class):
    """Wrong: the reference autograd.Function, which also keeps its first input as a ctx attribute."""
    class KeepsOnCtx(function_class):
        @staticmethod
        def forward(ctx, *args):
            out = function_class.forward(ctx, *args)
            ctx.first_input = args[0]
            return out
    return KeepsOnCtx


def test_a_tensor_kept_as_a_ctx_attribute_loses_the_points_of_the_function_s_check(monkeypatch):
    monkeypatch.setenv("MEMFIT_GRADING", "1")
    solution = load_solution("08_fine_tune")
    check = _check("08_fine_tune", "lora_function")
    with pytest.raises(CheckFailed, match=r"left a tensor in ctx\.first_input of KeepsOnCtx\.forward: keep the tensors"):
        check.run(keeps_a_tensor_on_ctx(solution.LoRAFunction), cases="visible")


def test_saved_tensors_lists_a_ctx_attribute_under_its_module():
    from memfit.gpt import COURSE_CONFIGS, GPT
    from memfit.training import random_batch, saved_tensors

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.x = x
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    class Doubler(torch.nn.Module):
        def forward(self, x):
            return Double.apply(x)

    cfg = COURSE_CONFIGS["tiny"]
    model = GPT(cfg)
    model.blocks[0].norm1 = torch.nn.Sequential(model.blocks[0].norm1, Doubler())
    idx, targets = random_batch(cfg, 1, 8, "cpu", seed=0)
    on_ctx = [s for s in saved_tensors(model, idx, targets) if s.kind == "ctx attribute"]
    assert [(s.module, s.shape) for s in on_ctx] == [("blocks.0.norm1.1", (1, 8, cfg.d_model))]


# ----------------------------------------------------------------------------- 6. the def line's defaults

def test_every_reference_keeps_its_def_line_s_defaults():
    from course.lessons import lessons
    for lesson in lessons():
        solution = load_solution(lesson)
        for check in checks_for(lesson):
            functions = tuple(getattr(solution, name) for name in check.uses)
            assert contracts.changed_defaults(check.uses, functions) is None, (lesson, check.name)


def test_a_changed_or_dropped_default_loses_the_check_s_points(monkeypatch):
    """AdamW's weight_decay defaults to 1e-2 in the exercise's def line: a ZeroAdamW whose default is 0 answers a
    caller who leaves it out with another optimizer, whatever the cases pass explicitly."""
    monkeypatch.setenv("MEMFIT_GRADING", "1")
    reference = load_solution("03_zero").ZeroAdamW

    class NoDecayByDefault(reference):
        def __init__(self, params, comm, stage, *, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                      param_dtype=torch.float32):
            super().__init__(params, comm, stage, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             param_dtype=param_dtype)
    zero_adamw = next(c for c in checks_for("03_zero") if c.name == "zero_adamw")
    with pytest.raises(CheckFailed, match=r"ZeroAdamW.__init__'s default weight_decay=0.0 is not the exercise's "
                                          r"weight_decay=0.01"):
        zero_adamw.run(NoDecayByDefault, cases="all")

    def rmsnorm_forward(x, weight, eps):  # every case passes eps: only the def line shows the dropped default
        return load_solution("04_kernel_fusion").rmsnorm_forward(x, weight, eps)
    check = next(c for c in checks_for("04_kernel_fusion") if c.name == "rmsnorm_forward")
    with pytest.raises(CheckFailed, match="rmsnorm_forward has no default for eps: keep the exercise's def line"):
        check.run(rmsnorm_forward, cases="all")
