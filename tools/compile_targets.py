"""Compile every reference kernel for the small GPUs, on any machine (no GPU needed).

    python -m tools.compile_targets [--profiles t4 v100 ...] [--lessons 06_fused_linear_ce ...]

For each lesson's KERNELS (autograder/checks/<topic>.py), loads the kernel from its solution
notebook, takes the config memfit.hardware chooses for the profile, compiles it with
triton.compile(..., target=GPUTarget("cuda", sm, 32)) and compares the shared memory the compiled
kernel needs with the card's limit. Prints one line per kernel x profile x dtype; exit 1 if any
fails to compile or does not fit.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import functools
import multiprocessing
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # @triton.jit must build real JITFunctions, even with no GPU

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from autograder import ROOT  # noqa: E402
from autograder.checks import lesson_topic  # noqa: E402
from autograder.notebook_loader import load_solution  # noqa: E402
from memfit.hardware import config, profile_for  # noqa: E402
from memfit.runtime import cpu_share  # noqa: E402

LAUNCH_OPTIONS = ("num_warps", "num_stages")


def lessons_with_kernels():
    import importlib
    for nb in sorted((ROOT / "solutions").glob("*.ipynb")):
        module = importlib.import_module(f"autograder.checks.{lesson_topic(nb.stem)}")
        if getattr(module, "KERNELS", None):
            yield nb.stem, module.KERNELS


def compile_one(fn, spec, prof, dtype: str) -> int:
    cfg = config(spec.config, prof)
    if spec.variant:
        cfg = cfg[spec.variant]
    constexprs = {**spec.constexprs, **{k: v for k, v in cfg.items() if k not in LAUNCH_OPTIONS}}
    signature = {name: t.format(dtype=dtype) for name, t in spec.signature.items()}
    signature.update({name: "constexpr" for name in constexprs})
    options = {k: cfg[k] for k in LAUNCH_OPTIONS if k in cfg}
    major, minor = prof.capability
    compiled = triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", major * 10 + minor, 32),
                              options=options)
    return compiled.metadata.shared


@functools.lru_cache(maxsize=None)
def _solution(lesson: str):
    return load_solution(lesson)


def _compile_job(lesson: str, index: int, name: str, dtype: str) -> tuple[str, int | None, str]:
    """(label, shared bytes or None, error): one kernel x profile x dtype, in a worker process."""
    spec = dict(lessons_with_kernels())[lesson][index]
    prof = profile_for(name)
    variant = f" {spec.variant}" if spec.variant else ""
    label = f"{lesson} {spec.kernel}{variant} [{dtype}] on {name} (sm_{prof.capability[0]}{prof.capability[1]})"
    try:
        return label, compile_one(getattr(_solution(lesson), spec.kernel), spec, prof, dtype), ""
    except Exception as exc:  # noqa: BLE001
        return label, None, f"{type(exc).__name__}: {str(exc)[:300]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["t4", "v100"])
    parser.add_argument("--lessons", nargs="+", help="only these lessons' kernels (a notebook's own report)")
    args = parser.parse_args(argv)
    known = dict(lessons_with_kernels())
    unknown = sorted(set(args.lessons or ()) - set(known))
    if unknown:
        parser.error(f"no kernels in lesson {', '.join(unknown)}; lessons with kernels: {', '.join(known)}")
    jobs = [(lesson, i, name, dtype) for lesson, kernels in known.items() if not args.lessons or lesson in args.lessons
            for i, spec in enumerate(kernels) for name in args.profiles for dtype in spec.dtypes]
    failures = 0
    # Compiling is CPU-bound (LLVM, ptxas): one worker per core, results printed in job order.
    # Spawned, not forked: loading a solution notebook on a GPU machine initialises CUDA, which a fork cannot.
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=cpu_share(), mp_context=spawn) as pool:
        for (_, _, name, _), (label, shared, error) in zip(jobs, pool.map(_compile_job, *zip(*jobs))):
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
