"""On a GPU: a submission whose Triton kernel stores far out of bounds (an illegal address: the CUDA context is
lost) and one that allocates past its per-process GPU memory cap lose only their own checks; the checks after
them run in a fresh process, and a reference graded beside them on the same GPU keeps every point. The peak-reset
attack is tried where it matters, against the CUDA allocator's meter."""
import json

import pytest
import torch

from tests.test_grading import LESSON, cell_index, load, rows_by, run_grader, with_source
from tests.test_tamper import RESETS_PEAK, _append

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: needs a GPU"),
              pytest.mark.xdist_group("grading_gpu")]

# The reference's scaled_add (renamed, the solution cell's code kept) for every check, but at the GPU check's scale
# (16M elements) a kernel that stores 2**34 elements past out: an illegal address there and nowhere else.
OUT_OF_BOUNDS = """

import triton
import triton.language as tl

@triton.jit
def _far_kernel(x_ptr, y_ptr, out_ptr, n, alpha, far, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs + far, x + alpha * y, mask=mask)

def scaled_add(x, y, alpha, out=None):
    if not isinstance(x, torch.Tensor) or x.numel() < (1 << 24) or not x.is_cuda:
        return _right_scaled_add(x, y, alpha, out=out)
    out = torch.empty_like(x) if out is None else out
    _far_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), alpha, 1 << 34, BLOCK=1024)
    return out
"""

OVER_CAP = """
import math, torch
def bytes_of(shape, dtype):
    total = torch.cuda.get_device_properties(0).total_memory
    hog = torch.empty(int(0.6 * total), dtype=torch.uint8, device="cuda")  # past a cap of 0.475 (2 workers, 1 GPU)
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()
"""


@pytest.fixture(scope="module")
def gpu_class(tmp_path_factory):
    solution = load("solutions")
    notebooks = {
        "reference": solution,
        "out_of_bounds": with_source(solution, "scaled_add_solution", "".join(
            solution["cells"][cell_index(solution, "scaled_add_solution")]["source"]).replace(
            "def scaled_add(", "def _right_scaled_add(") + OUT_OF_BOUNDS),
        "over_cap": with_source(solution, "bytes_of_solution", OVER_CAP),
        "resets_peak": _append(solution, RESETS_PEAK),
        "reference_after": solution,
    }
    subs = tmp_path_factory.mktemp("gpu_class")
    for student, nb in notebooks.items():
        (subs / student).mkdir()
        (subs / student / f"{LESSON}.ipynb").write_text(json.dumps(nb))
    out = tmp_path_factory.mktemp("grades")
    proc = run_grader("--submissions", subs, "--workers", 2, "--out", out, timeout=1800)
    print(proc.stdout, proc.stderr[-3000:])
    return out


def statuses(out, student):
    return {name: r["status"] for name, r in rows_by(out, student).items()}


@pytest.mark.parametrize("student", ["reference", "reference_after"])
def test_references_keep_every_point(gpu_class, student):
    assert set(statuses(gpu_class, student).values()) == {"passed"}, rows_by(gpu_class, student)


def test_out_of_bounds_store_loses_only_its_check(gpu_class):
    rows = rows_by(gpu_class, "out_of_bounds")
    assert rows["scaled_add_gpu"]["status"] == "error" and rows["scaled_add_gpu"]["points"] == "0", rows["scaled_add_gpu"]
    assert "illegal" in rows["scaled_add_gpu"]["message"].lower() or "CUDA" in rows["scaled_add_gpu"]["message"]
    assert {n: s for n, s in statuses(gpu_class, "out_of_bounds").items() if n != "scaled_add_gpu"} == \
        {"bytes_of": "passed", "scaled_add_numerics": "passed", "scaled_add_memory": "passed"}


def test_allocation_past_the_cap_loses_only_its_check(gpu_class):
    rows = rows_by(gpu_class, "over_cap")
    assert rows["bytes_of"]["status"] == "error" and "out of memory" in rows["bytes_of"]["message"].lower(), rows["bytes_of"]
    assert {n: s for n, s in statuses(gpu_class, "over_cap").items() if n != "bytes_of"} == \
        {"scaled_add_numerics": "passed", "scaled_add_memory": "passed", "scaled_add_gpu": "passed"}


def test_peak_reset_is_refused_on_the_cuda_meter(gpu_class):
    rows = rows_by(gpu_class, "resets_peak")
    for check in ("scaled_add_memory", "scaled_add_gpu"):
        assert rows[check]["points"] == "0" and "tried to reset the peak-memory statistics" in rows[check]["message"]
