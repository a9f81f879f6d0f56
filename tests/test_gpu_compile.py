"""What runs in Triton's interpreter must compile for a GPU (autograder/checks/gpu_compile.py), through the checks as
they are: every reference kernel compiles for the course's targets (test_checks_*'s reference cases run Check.run,
which compiles them); a wrong implementation made generically from a reference, each of its kernels reading a module
global (which the interpreter allows and every GPU's compiler refuses), loses the check's points with the compiler's
words; a launch this module cannot translate gives no verdict rather than a wrong one."""
import ast
import contextlib
import inspect
import linecache
import textwrap

import pytest
import torch

import memfit
from autograder.checks import CheckFailed, checks_for, gpu_compile
from course.notebook_loader import load_solution

pytestmark = pytest.mark.skipif(not memfit.INTERPRETED, reason="kernels compile to run on a GPU machine: nothing "
                                                                "to check there")

# (lesson, check): a check of each lesson with kernels, whose learner functions are plain functions
KERNEL_CHECKS = [("00_first_kernel", "scaled_add_numerics"), ("04_kernel_fusion", "rmsnorm_forward"),
                 ("05_flash_attention", "flash_delta"), ("06_fused_linear_ce", "fused_linear_ce_forward"),
                 ("07_quantization", "q8_0")]


@contextlib.contextmanager
def kernels_reading_a_global(module):
    """Within the block, every kernel of the module first reads the module-level float SCALE (a statement added at
    the top of its body); the module as it was after."""
    from triton.runtime.interpreter import InterpretedFunction
    space = vars(module)
    kept = dict(space)
    try:
        space["SCALE"] = 1.0
        for name, value in kept.items():
            if isinstance(value, InterpretedFunction) and value.fn.__globals__ is space:
                tree = ast.parse(textwrap.dedent(inspect.getsource(value.fn)))
                body = tree.body[0].body
                at = 1 if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else 0
                body.insert(at, ast.parse("unused = SCALE").body[0])
                source = ast.unparse(tree) + "\n"
                filename = f"<wrong_{name}.ipynb cell 1>"  # the interpreter reads a kernel's source back
                linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
                exec(compile(source, filename, "exec"), space)
        yield module
    finally:
        space.clear()
        space.update(kept)


@pytest.mark.parametrize("lesson,name", KERNEL_CHECKS)
def test_a_kernel_only_the_interpreter_accepts_loses_the_points(lesson, name):
    check = next(c for c in checks_for(lesson) if c.name == name)
    reference = load_solution(lesson)
    check.run(*[getattr(reference, n) for n in check.uses], cases="visible")  # the reference keeps them
    with kernels_reading_a_global(reference) as wrong:
        with pytest.raises(CheckFailed, match="does not compile for a GPU .*Cannot access global variable SCALE"):
            check.run(*[getattr(wrong, n) for n in check.uses], cases="visible")


def test_a_launch_it_cannot_translate_gets_no_verdict():
    def kernel(x_ptr, table, n, BLOCK: "tl.constexpr"):
        pass
    found = gpu_compile.launch_signature(kernel, (torch.zeros(4), {"a": 1}, 4), {"BLOCK": 16})
    assert found is None  # a dict argument: not compiled, so not refused
    signature, constexprs, _ = gpu_compile.launch_signature(kernel, (torch.zeros(4, dtype=torch.bfloat16), 2**40, 4),
                                                            {"BLOCK": 16, "num_warps": 2})
    assert signature == {"x_ptr": "*bf16", "table": "i64", "n": "i32", "BLOCK": "constexpr"}
    assert constexprs == {"BLOCK": 16}
