"""autograder/checks/host_memory.py: under a memory meter, a call of learner code may hold no tensor-sized NumPy array
(the work the tensor meter cannot see). The contract alone, then through the checks as they are: a wrong
implementation made generically from the reference (the right result, with the problem's largest array made in NumPy
on the way) loses the memory check's points through the shared harness; the reference keeps them."""
import functools
import os
import sys

import numpy as np
import pytest
import torch

import memfit  # (sets TRITON_INTERPRET on a machine without a GPU, before triton is imported)
import triton
import triton.language as tl

from autograder.checks import CheckFailed, call_learner, checks_for, contracts, host_memory
from course.notebook_loader import load_solution
from memfit.meter import measure_peak

BIG = host_memory.HOST_ALLOWANCE  # bytes: one array this large is over the allowance


def _measured(fn, *args):
    """fn(*args) through call_learner, measured as a memory check measures it."""
    return measure_peak(lambda: call_learner(fn, *args, what="f(...)"), device="cpu")


def holds_an_array(n_bytes):
    return np.ones(n_bytes // 8 + 1).sum()


def test_a_tensor_sized_array_in_numpy_fails_and_a_small_one_passes():
    with pytest.raises(CheckFailed, match=r"f\(\.\.\.\) held .* of NumPy arrays or Python buffers at once"):
        _measured(holds_an_array, BIG)
    _measured(holds_an_array, 1024)
    assert not __import__("tracemalloc").is_tracing()


def test_no_meter_no_contract():
    """Outside a memory check, host arrays are the learner's business (and nothing is traced: no cost)."""
    call_learner(holds_an_array, 4 * BIG, what="f(...)")


def test_an_array_freed_and_another_made_counts_once_each_not_their_sum():
    def one_after_another():
        for _ in range(8):
            holds_an_array(BIG // 2)
    _measured(one_after_another)


@triton.jit
def _double_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def test_a_triton_launch_and_a_first_import_are_the_process_s_not_the_call_s(tmp_path, monkeypatch):
    """Triton's interpreter emulates a launch with NumPy arrays of its tiles, and a first import holds its module's
    code: neither is the learner's work."""
    (tmp_path / "freshly_imported_module.py").write_text("BUFFER = bytes(%d)\n" % (4 * BIG))
    monkeypatch.syspath_prepend(str(tmp_path))

    def launches_and_imports(x):
        _double_kernel[(triton.cdiv(x.numel(), 4096),)](x, x.numel(), BLOCK=4096)
        import freshly_imported_module  # noqa: F401
        return x
    try:
        _measured(launches_and_imports, torch.ones(1 << 17))
    finally:
        sys.modules.pop("freshly_imported_module", None)


def test_an_array_held_across_a_launch_counts_with_one_made_after_it():
    """Tracing pauses during a launch (its interpreter's allocations are not the call's and cost time to trace); what
    was held when it paused is carried, so two arrays held together are their sum though a launch ran between."""
    def across_a_launch(x):
        first = np.ones(BIG // 2 // 8 + 64)
        _double_kernel[(triton.cdiv(x.numel(), 1024),)](x, x.numel(), BLOCK=1024)
        second = np.ones(BIG // 2 // 8 + 64)
        return x + float(first[0] + second[0])
    with pytest.raises(CheckFailed, match="held .* of NumPy arrays or Python buffers at once"):
        _measured(across_a_launch, torch.ones(4096))


def test_many_launches_with_small_python_objects_between_them_pass():
    """A loop of launches keeps its arguments and tuples alive across each pause: they are not carried."""
    def many_launches(x):
        views = []
        for row in range(300):
            views.append((row, x[row]))
            _double_kernel[(1,)](x[row], x.shape[1], BLOCK=16)
        return x
    _measured(many_launches, torch.ones(300, 16))


# ----------------------------------------------------------------------------- through the checks as they are

def _first_tensors(args, kwargs, count):
    return contracts.tensors_in((args, kwargs))[:count]


def _host_array(t: torch.Tensor) -> np.ndarray:
    """t's elements as float64 in NumPy, through a host copy (no tensor made under the meter)."""
    host = t.detach().cpu()
    return (host.view(torch.int16) if host.dtype == torch.bfloat16 else host).numpy().astype(np.float64)


def product_in_numpy(fn):
    """Wrong: the right result, after the product of its first two tensor arguments (x @ Wᵀ: the N x V logits, or
    the dequantized weight's product) made on the host in NumPy."""
    @functools.wraps(fn)
    def wrong(*args, **kwargs):
        x, w = _first_tensors(args, kwargs, 2)
        host = _host_array(x).reshape(-1, x.shape[-1]) @ _host_array(w).reshape(-1, x.shape[-1]).T
        del host
        return fn(*args, **kwargs)
    return wrong


def copies_in_numpy(fn):
    """Wrong: the right result, after fp64 host copies of every tensor argument made in NumPy."""
    @functools.wraps(fn)
    def wrong(*args, **kwargs):
        copies = [_host_array(t) for t in _first_tensors(args, kwargs, 8)]
        del copies
        return fn(*args, **kwargs)
    return wrong


CASES = [("00_first_kernel", "scaled_add_memory", copies_in_numpy),
         ("04_kernel_fusion", "pow4_memory", copies_in_numpy),
         ("06_fused_linear_ce", "fused_linear_ce_memory", product_in_numpy),
         ("07_quantization", "int8_matmul_memory", copies_in_numpy)]


@pytest.mark.parametrize("lesson, name, wrap", CASES, ids=[f"{c[0][:2]}-{c[1]}" for c in CASES])
def test_work_done_in_numpy_loses_the_memory_check_s_points(lesson, name, wrap, monkeypatch):
    monkeypatch.setenv("MEMFIT_GRADING", "1")
    check = next(c for c in checks_for(lesson) if c.name == name)
    solution = load_solution(lesson)
    functions = [getattr(solution, n) for n in check.uses]
    with pytest.raises(CheckFailed, match="of NumPy arrays or Python buffers at once"):
        check.run(wrap(functions[0]), *functions[1:], cases="all")


def test_lesson_00_s_visible_memory_cases_show_work_done_in_numpy(monkeypatch):
    """The notebook's own check cell shows the contract: its visible cases are large enough that host copies of the
    inputs pass the allowance (a learner meets the failure before grading)."""
    monkeypatch.setenv("MEMFIT_GRADING", "1")
    check = next(c for c in checks_for("00_first_kernel") if c.name == "scaled_add_memory")
    with pytest.raises(CheckFailed, match="of NumPy arrays or Python buffers at once"):
        check.run(copies_in_numpy(load_solution("00_first_kernel").scaled_add), cases="visible")
