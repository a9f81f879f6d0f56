"""Compile every reference kernel for the small GPUs, on any machine (no GPU needed).

    python -m tools.compile_targets [--profiles t4 v100 ...]

For each lesson's KERNELS (autograder/checks/<topic>.py), loads the kernel from its solution
notebook, takes the config memfit.hardware chooses for the profile, compiles it with
triton.compile(..., target=GPUTarget("cuda", sm, 32)) and compares the shared memory the compiled
kernel needs with the card's limit. Prints one line per kernel x profile x dtype; exit 1 if any
fails to compile or does not fit.
"""
from __future__ import annotations

import argparse
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

LAUNCH_OPTIONS = ("num_warps", "num_stages")


def lessons_with_kernels():
    import importlib
    for nb in sorted((ROOT / "solutions").glob("*.ipynb")):
        module = importlib.import_module(f"autograder.checks.{lesson_topic(nb.stem)}")
        if getattr(module, "KERNELS", None):
            yield nb.stem, module.KERNELS


def compile_one(fn, spec, prof, dtype: str) -> int:
    cfg = config(spec.config, prof)
    constexprs = {k: v for k, v in cfg.items() if k not in LAUNCH_OPTIONS}
    signature = {name: t.format(dtype=dtype) for name, t in spec.signature.items()}
    signature.update({name: "constexpr" for name in constexprs})
    options = {k: cfg[k] for k in LAUNCH_OPTIONS if k in cfg}
    major, minor = prof.capability
    compiled = triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", major * 10 + minor, 32),
                              options=options)
    return compiled.metadata.shared


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["t4", "v100"])
    args = parser.parse_args(argv)
    failures = 0
    for lesson, kernels in lessons_with_kernels():
        solution = load_solution(lesson)
        for spec in kernels:
            for name in args.profiles:
                prof = profile_for(name)
                for dtype in spec.dtypes:
                    label = f"{lesson} {spec.kernel} [{dtype}] on {name} (sm_{prof.capability[0]}{prof.capability[1]})"
                    try:
                        shared = compile_one(getattr(solution, spec.kernel), spec, prof, dtype)
                    except Exception as exc:  # noqa: BLE001
                        print(f"FAIL {label}: does not compile: {type(exc).__name__}: {str(exc)[:300]}")
                        failures += 1
                        continue
                    fits = shared <= prof.shared_memory_per_block
                    failures += not fits
                    print(f"{'ok  ' if fits else 'FAIL'} {label}: {shared} bytes of shared memory, "
                          f"limit {prof.shared_memory_per_block}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
