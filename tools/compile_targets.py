"""Compile every reference kernel for the small GPUs, on any machine (no GPU needed).

    python -m tools.compile_targets [--profiles t4 v100 ...] [--lessons 06_fused_linear_ce ...] [--dtypes fp16]
    python -m tools.compile_targets --notebook 05_flash_attention.ipynb [--dtypes fp16] [--variants d128]

For each lesson's KERNELS (autograder/checks/<topic>.py), loads the kernel from its solution
notebook (or, with --notebook, from that notebook as last saved: a learner's own kernels, which a
lesson's compile report names), takes the config memfit.hardware chooses for the profile, compiles it with
triton.compile(..., target=GPUTarget("cuda", sm, 32)) and compares the shared memory the compiled
kernel needs with the card's limit. Prints one line per kernel x profile x dtype; exit 1 if any
fails to compile or does not fit.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import io
import multiprocessing
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # @triton.jit must build real JITFunctions, even with no GPU

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from course.lessons import checks_module, lessons  # noqa: E402
from memfit.notebook import NotebookError, lesson_of, load_notebook, read_notebook  # noqa: E402
from course.notebook_loader import load_solution  # noqa: E402
from memfit.hardware import config, profile_for  # noqa: E402
from memfit.runtime import cpu_share  # noqa: E402

LAUNCH_OPTIONS = ("num_warps", "num_stages")


def lessons_with_kernels():
    import importlib
    for lesson in lessons():
        module = importlib.import_module(checks_module(lesson))
        if getattr(module, "KERNELS", None):
            yield lesson, module.KERNELS


def compile_one(fn, spec, prof, dtype: str) -> int:
    cfg = config(spec.config, prof)
    if spec.variant:
        cfg = cfg[spec.variant]
    # a config may serve kernels that take different subsets of it (lesson 06's block filter and its products)
    constexprs = {**spec.constexprs, **{k: v for k, v in cfg.items() if k not in LAUNCH_OPTIONS and k in fn.arg_names}}
    signature = {name: t.format(dtype=dtype) for name, t in spec.signature.items()}
    signature.update({name: "constexpr" for name in constexprs})
    options = {k: cfg[k] for k in LAUNCH_OPTIONS if k in cfg}
    major, minor = prof.capability
    compiled = triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", major * 10 + minor, 32),
                              options=options)
    return compiled.metadata.shared


@functools.lru_cache(maxsize=None)
def _kernels_of(lesson: str, notebook: str | None):
    """The module holding the lesson's kernels: its solution, or the given notebook's graded code."""
    if notebook is None:
        return load_solution(lesson)
    with contextlib.redirect_stdout(io.StringIO()):  # the notebook's prints are for its reader
        return load_notebook(notebook, cell_timeout_s=None).module


def _compile_job(lesson: str, index: int, name: str, dtype: str, notebook: str | None) -> tuple[str, int | None, str]:
    """(label, shared bytes or None, error): one kernel x profile x dtype, in a worker process."""
    spec = dict(lessons_with_kernels())[lesson][index]
    prof = profile_for(name)
    variant = f" {spec.variant}" if spec.variant else ""
    label = f"{lesson} {spec.kernel}{variant} [{dtype}] on {name} (sm_{prof.capability[0]}{prof.capability[1]})"
    try:
        kernel = getattr(_kernels_of(lesson, notebook), spec.kernel, None)
        if kernel is None:
            return label, None, f"the notebook defines no {spec.kernel}"
        return label, compile_one(kernel, spec, prof, dtype), ""
    except Exception as exc:  # noqa: BLE001
        return label, None, _why(exc, prof)


def _why(exc: Exception, prof) -> str:
    """One line: Triton's last line says why; ptxas's says how to rerun it, so its error line is taken instead."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and "Repro command" not in line]
    errors = [line for line in lines if "error" in line.lower()]
    why = f"{type(exc).__name__}: {(errors or lines or [''])[-1][:200]}"
    if "NotImplementedError" in str(exc) or "node type: Raise" in str(exc):
        why += " (still the stub: write the kernel first)"
    elif type(exc).__name__ == "PTXASError" and prof.capability < (7, 5):
        why += (" (CUDA 13's ptxas no longer builds for Volta: compiling for a V100 needs a CUDA 12 ptxas "
                "(triton's own wheel ships one))")
    return why


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["t4", "v100"])
    parser.add_argument("--lessons", nargs="+", help="only these lessons' kernels")
    parser.add_argument("--notebook", help="compile this notebook's kernels (its lesson's), as last saved")
    parser.add_argument("--dtypes", nargs="+", help="only these dtypes (fp16, fp32)")
    parser.add_argument("--variants", nargs="+", help="only these config variants (lesson 05: d64, d128)")
    args = parser.parse_args(argv)
    known = dict(lessons_with_kernels())
    notebook = None
    if args.notebook:
        try:
            args.lessons = [lesson_of(read_notebook(args.notebook), args.notebook)]
        except NotebookError as exc:
            parser.error(str(exc))
        notebook = os.path.abspath(args.notebook)
    unknown = sorted(set(args.lessons or ()) - set(known))
    if unknown:
        parser.error(f"no kernels in lesson {', '.join(unknown)}; lessons with kernels: {', '.join(known)}")
    jobs = [(lesson, i, name, dtype, notebook) for lesson, kernels in known.items()
            if not args.lessons or lesson in args.lessons
            for i, spec in enumerate(kernels) for name in args.profiles for dtype in spec.dtypes
            if (not args.dtypes or dtype in args.dtypes) and (not args.variants or spec.variant in args.variants)]
    failures = 0
    # Compiling is CPU-bound (LLVM, ptxas): one worker per core, results printed in job order.
    # Spawned, not forked: loading a solution notebook on a GPU machine initialises CUDA, which a fork cannot.
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=cpu_share(), mp_context=spawn) as pool:
        for (_, _, name, _, _), (label, shared, error) in zip(jobs, pool.map(_compile_job, *zip(*jobs))):
            if shared is None:
                print(f"FAIL {label}: does not compile: {error}")
                failures += 1
                continue
            limit = profile_for(name).shared_memory_per_block
            fits = shared <= limit
            failures += not fits
            print(f"{'ok  ' if fits else 'FAIL'} {label}: {shared} bytes of shared memory, limit {limit}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
