"""Checks: one module per lesson (autograder/checks/<topic>.py for lessons/NN_<topic>.ipynb).

A lesson module defines check functions that the notebook's test cells call directly (visible
cases, and hidden cases inside nbgrader's hidden-test region), and CHECKS: the list the grader
runs, each naming the nbgrader grade_id of its test cell, its points and the learner functions it
needs. A check raises CheckFailed (wrong answer), NotImplementedYet (a stub), LearnerCodeError
(the learner's code raised) or CheckSkipped (the machine lacks what it needs); returning means
passed.
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from autograder.answers import handed_to_graded_code
from autograder.checks import contracts, gpu_compile, host_memory  # (imported before any notebook runs: it reads the solutions' signatures)
from course.lessons import checks_module, topic

CASES = ("visible", "hidden", "all")


class CheckFailed(AssertionError):
    """The learner's answer is wrong; the message says how."""


class KernelRefused(CheckFailed):
    """Every case passed in Triton's interpreter, and a kernel does not compile for a GPU (gpu_compile.py)."""


class NotImplementedYet(CheckFailed):
    """The learner's function is still the stub."""


class LearnerCodeError(CheckFailed):
    """The learner's code raised an exception."""


class CheckSkipped(Exception):
    """This machine cannot run the check (for example: it needs a GPU)."""


_GRADER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
GRADING_ENV = "MEMFIT_GRADING"  # set by the grader's processes and by nbgrader_config.py


def skip(reason: str) -> None:
    """This machine cannot run the check. Under a grader (MEMFIT_GRADING=1: our runner, nbgrader's
    autograde) it raises CheckSkipped, so the check earns nothing and is listed as skipped, never a
    silent pass. A learner running the notebook sees the reason and "Run All" carries on."""
    if os.environ.get(GRADING_ENV) == "1":
        raise CheckSkipped(reason)
    print(reason.replace("skipped:", "SKIPPED:", 1) if reason.startswith("skipped:") else f"SKIPPED: {reason}")


@dataclass(frozen=True)
class Check:
    name: str  # the grade_id of the notebook's test cell
    points: float
    body: Callable[..., None]  # body(*learner_functions, cases=...): the check's own cases
    uses: tuple[str, ...]  # names of the learner's functions it is given, in order
    needs_gpu: bool = False
    timeout_s: float = 120.0
    references: bool = False  # asks autograder.checks.references for values computed once per class

    def run(self, *functions: Callable, cases: str = "all", compile_kernels: bool = True) -> None:
        """The check as every caller runs it (the grader, the tests, the blind set): its cases through call_learner,
        with decoys of its own (a grade does not depend on what ran before), then, where kernels ran in Triton's
        interpreter, each learner kernel it launched compiled for the GPU targets (gpu_compile.py; not by the
        notebook's own check cell, so compile_kernels=False runs the check as that cell does)."""
        changed = contracts.changed_defaults(self.uses, functions)  # (contract 6: the def line's defaults)
        if changed:
            raise CheckFailed(changed)
        contracts.new_check(inputs_on_a_gpu=bool(getattr(sys.modules.get(self.body.__module__), "KERNELS", None)))
        gpu_compile.new_check()
        with gpu_compile.recording_kernels():
            self.body(*functions, cases=cases)
        refused = gpu_compile.failures(self.name) if compile_kernels else None
        if refused:
            raise KernelRefused(refused)


def time_limit(check: Check, override: str | None = None) -> float:
    """The check's limit in seconds: its own, or the override's (MEMFIT_CHECK_TIMEOUT_S): "45" sets every check's,
    "45,bytes_of=10" every check's but bytes_of's, "bytes_of=10" that one check's alone."""
    limits: dict[str, float] = {}
    for part in filter(None, (override or "").replace(" ", "").split(",")):
        name, _, seconds = part.rpartition("=")
        limits[name] = float(seconds)
    return limits.get(check.name, limits.get("", check.timeout_s))


@dataclass(frozen=True)
class KernelSpec:
    """A reference Triton kernel that must compile for every profile (T4 and V100 included)
    with the config memfit.hardware chooses, within the card's shared memory."""
    kernel: str  # the @triton.jit function's name in the solution notebook
    config: str  # its key in memfit.hardware.KERNEL_CONFIGS
    signature: dict[str, str]  # argument -> Triton type; "{dtype}" is replaced per dtype
    dtypes: tuple[str, ...] = ("fp16", "fp32")
    variant: str | None = None  # a config with variants (lesson 05: per head dim) compiles this one
    constexprs: dict = field(default_factory=dict)  # fixed meta-parameters besides the config's (D, CAUSAL)


def call_learner(fn: Callable, *args, what: str | None = None, **kwargs):
    """Call learner code; turn a stub or an exception into a message a learner can act on. Every call keeps the
    contracts of autograder/checks/contracts.py (no state between calls, a new result each call, no autograd graph
    nobody asked for): decoy calls before the first calls at a new signature, and a look at what is returned; under
    a memory meter, no more host arrays than autograder/checks/host_memory.py allows."""
    what = what or f"{getattr(fn, '__name__', 'your function')}(...)"
    try:
        # np.errstate: Triton's interpreter computes with NumPy, whose floating warnings (0 * inf, overflow) a GPU
        # never prints; on stderr they would cost a check cell its points under nbgrader
        with np.errstate(all="ignore"), numerics.loads_in_bounds(what), contracts.host_boundary(args, kwargs):
            decoys = contracts.run_decoys(fn, args, kwargs, _release)  # (autograder/checks/contracts.py: why)
            with host_memory.host_peak(what, _fail):  # under a memory meter: no tensor-sized work in NumPy
                result = fn(*args, **kwargs)
        broken = contracts.broken_contract(fn, args, kwargs, result, decoys, what)
        del decoys
        if broken:
            raise CheckFailed(f"{what} {broken}")
        return result
    except NotImplementedError:
        raise NotImplementedYet(f"{getattr(fn, '__name__', 'this exercise')} is not implemented yet: "
                                "replace the `raise NotImplementedError()` in its cell with your code") from None
    except (CheckFailed, CheckSkipped):
        raise
    except Exception as exc:
        frames = traceback.extract_tb(exc.__traceback__)  # the learner's line, not the grader's guard that raised
        where = next((f for f in reversed(frames) if not f.filename.startswith(_GRADER_DIR)), frames[-1])
        message = f"{what} raised {type(exc).__name__}: {exc} (at {where.filename}, line {where.lineno})"
        _release(exc)
    raise LearnerCodeError(message)


def _fail(message: str) -> None:
    raise CheckFailed(message)


def _release(exc: BaseException) -> None:
    """Let go of what the learner's failed call left suspended, now rather than whenever the garbage collector finds
    it. An exception inside torch.utils.checkpoint leaves its generator open (its frame holds it); closed later, in
    the middle of the next case, it restores autograd hooks and RNG states out of order and hands that case tensors
    of a finished FakeTensorMode."""
    traceback.clear_frames(exc.__traceback__)
    exc.__traceback__ = None


def expect_value_error(fn: Callable, *args, what: str, why: str = "for it") -> None:
    """fn(*args) must raise ValueError: bad arguments get a clear error, not a number or another exception, and
    before anything is written into them (the tensors among the arguments hold the same bits after)."""
    try:
        with numerics.unchanged_arguments(args, what):
            fn(*args)
    except ValueError:
        return
    except NotImplementedError:
        call_learner(fn, *args)  # reports the stub
    except Exception as exc:
        raised = type(exc).__name__
        _release(exc)
        raise CheckFailed(f"{what} raised {raised}: raise ValueError naming the bad argument") from None
    raise CheckFailed(f"{what} returned a value: raise ValueError {why}")


def check_cases(cases: str) -> tuple[bool, bool]:
    """(run the visible cases, run the hidden cases)."""
    if cases not in CASES:
        raise ValueError(f"cases must be one of {CASES}, not {cases!r}")
    return cases in ("visible", "all"), cases in ("hidden", "all")


def select(records, cases: str) -> list:
    """The case records `cases` runs, in their order: every check module plans its cases through this one function.
    `records`: {"visible": [...], "hidden": [...]}, or records with a `hidden` flag (None: run by either part, once),
    and optionally `gpu_only` / `cpu_only` (run on that kind of machine only)."""
    visible, hidden = check_cases(cases)
    if isinstance(records, dict):
        return (list(records["visible"]) if visible else []) + (list(records["hidden"]) if hidden else [])
    runs = {False: visible, True: hidden, None: visible or hidden}
    import memfit  # (imported by every check module already: here only for HAS_GPU)
    gpu = memfit.HAS_GPU
    return [r for r in records if runs[r.hidden] and (gpu or not getattr(r, "gpu_only", False))
            and not (gpu and getattr(r, "cpu_only", False))]


def checks_for(lesson: str) -> list[Check]:
    """The CHECKS list of a lesson; LookupError names the lesson when it has none."""
    try:
        module = importlib.import_module(checks_module(lesson))
    except ModuleNotFoundError as exc:
        raise LookupError(f"no checks exist for lesson {lesson} (autograder/checks/{topic(lesson)}.py)") from exc
    return list(module.CHECKS)


class given_references:
    """Grade one exercise on its own: while active, the names `replacements` gives are rebound, in the module
    where the learner's function `fn` was defined (a notebook's namespace), to the course's reference code.

        with given_references(chunked_linear_ce, cross_entropy_with_grad=reference.cross_entropy_with_grad):
            ...  # the learner's chunked_linear_ce now calls the reference cross_entropy_with_grad

    So a bug in exercise A costs A's points only, not those of exercise B that calls it, and B's message never
    points at A's cell. Names the module does not define are left alone (a learner who inlined A needs nothing)."""

    def __init__(self, fn: Callable, **replacements):
        fn = getattr(fn, "__func__", fn)
        self.namespace = getattr(fn, "__globals__", None)
        if self.namespace is None and isinstance(fn, type):  # a class: the module of its methods
            # (a decorated method, @torch.no_grad() step, is torch's wrapper: its __wrapped__ is the method)
            methods = [getattr(m, "__wrapped__", m) for m in vars(fn).values()]
            methods = [m for m in methods if hasattr(getattr(m, "__func__", m), "__globals__")]
            self.namespace = getattr(getattr(methods[0], "__func__", methods[0]), "__globals__", None) if methods else None
        self.replacements = {k: v for k, v in replacements.items() if self.namespace is not None and k in self.namespace}
        self.saved: dict = {}
        self.handed = handed_to_graded_code(self.replacements.values())  # graded code may call these while active

    def __enter__(self):
        for name, value in self.replacements.items():
            self.saved[name] = self.namespace[name]
            self.namespace[name] = value
        self.handed.__enter__()
        return self

    def __exit__(self, *exc):
        self.handed.__exit__(*exc)
        for name, value in self.saved.items():
            self.namespace[name] = value
        self.saved.clear()
        return False


# Last, as it needs CheckFailed above; imported with the package, before any notebook runs: the grading child blocks
# reading the grader's files while graded code runs, and call_learner uses it on every call.
from autograder.checks import numerics  # noqa: E402
