"""A kernel that writes up to one block past the end of its output loses the check's points, with a message that
names the out-of-bounds write: on a CPU (Triton's interpreter) and on a GPU, where without guard regions such a
store lands unseen in the caching allocator's slack. Each mutant below writes past the end of a tensor, either
one the learner allocated or an out= the check passed."""
import importlib

import pytest
import torch

from autograder.checks import CheckFailed, checks_for
from course.notebook_loader import load_solution
from tests.mutants.registry import REF, as_mapping

OUT_OF_BOUNDS = [  # (lesson, check, {function: "module:mutant" or REF})
    ("00_first_kernel", "scaled_add_numerics", {"scaled_add": "tests.mutants.first_kernel:scaled_add_no_store_mask"}),
    ("00_first_kernel", "scaled_add_numerics", {"scaled_add": "tests.mutants.blind.first_kernel:scaled_add_mask_off_by_one"}),
    ("00_first_kernel", "scaled_add_numerics", {"scaled_add": "tests.mutants.blind.first_kernel:scaled_add_mask_lane_index"}),
    ("04_kernel_fusion", "pow4_numerics", {"pow4": "tests.mutants.kernel_fusion:pow4_unmasked_store"}),
    ("04_kernel_fusion", "pow4_numerics", {"pow4": "tests.mutants.blind.kernel_fusion:pow4_mask_off_by_one"}),
    ("07_quantization", "q8_0", {"quantize_q8_0": REF,
                                 "dequantize_q8_0": "tests.mutants.quantization:q8_dequantize_masked_by_block"}),
]
GPU_CHECKS = {"00_first_kernel": "scaled_add_gpu"}  # on a GPU, the check that runs the compiled kernel at scale


def _function(spec):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("lesson, check_name, entry", OUT_OF_BOUNDS,
                         ids=[f"{c}-{[v for v in e.values() if v != REF][0].split(':')[-1]}" for _, c, e in OUT_OF_BOUNDS])
def test_a_write_past_the_end_is_named(lesson, check_name, entry, monkeypatch):
    monkeypatch.setenv("MEMFIT_GRADING", "1")
    names = [check_name] + ([GPU_CHECKS[lesson]] if torch.cuda.is_available() and lesson in GPU_CHECKS else [])
    for name in names:
        check = next(c for c in checks_for(lesson) if c.name == name)
        mapping = as_mapping(entry, check.uses)
        fns = [getattr(load_solution(lesson), fn) if spec == REF else _function(spec)
               for fn, spec in mapping.items()]
        with pytest.raises(CheckFailed, match="out of bounds|past the end"):
            check.run(*fns, cases="all")
