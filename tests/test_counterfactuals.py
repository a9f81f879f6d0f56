"""Cases that discriminate by construction: for every option of every graded function (tests/counterfactuals.py) and
every kind of value the check's cases give it, the reference answering those calls as if the option had another value
loses the check's points. A counterfactual that keeps them names an option no case can see, which a learner could
ignore and keep the points.

The check runs as the grader runs it (check.run(..., cases="all") under MEMFIT_GRADING=1, hidden seed 0): once with
the reference, recording the kinds each option receives, then once per option and kind with the counterfactual."""
from __future__ import annotations

import collections.abc
import functools
import importlib
import inspect

import pytest
import torch

from autograder.checks import CheckFailed, CheckSkipped, LearnerCodeError, checks_for, checks_module
from autograder.checks.contracts import in_decoy
from autograder.checks.domain import HIDDEN_SEED_ENV
from tests.counterfactuals import (COUNTERFACTUALS, DTYPE, EXEMPT, KNOWN_BLIND, MEMORY_TWINS, NO_OTHER, REASONS, WHOLE_CALL,
                                   Option, axis_proof, ref)
from tests.mutants.registry import LESSONS


def _target(obj):
    """What to wrap to see an option: a function itself, a class's __init__, an autograd.Function's forward."""
    if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
        return "forward"
    if isinstance(obj, type):
        return "__init__"
    return None


def answering(obj, options: list[Option], change: tuple[Option, str] | None, seen: dict):
    """obj with every call's options recorded in `seen` (option -> kinds), and, where `change` = (option, kind),
    the calls whose option has that kind answered with option.other(value) instead."""
    where = _target(obj)
    fn = getattr(obj, where) if where else obj
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        # a one-pass iterator (online_softmax's blocks) is read into a list, to look at, and handed on as one again
        passes = {k for k, v in bound.arguments.items() if isinstance(v, collections.abc.Iterator)}
        bound.arguments.update({k: list(bound.arguments[k]) for k in passes})
        arguments = dict(bound.arguments)
        reached = []
        lower = None
        for option in options if not in_decoy() else ():  # a decoy's result is not compared with a right answer
            value = (_floating_dtype(arguments) if option.param == DTYPE else arguments if option.param in WHOLE_CALL
                     else arguments[option.param])
            kind = option.kind(value)
            if kind is None:
                continue
            other = option.other(value, arguments)
            if other is NO_OTHER:  # no value the text allows answers this call otherwise
                continue
            reached.append((option, kind))
            if change is not None and change[0] is option and change[1] == kind:
                if option.param == DTYPE:
                    lower = other
                elif option.param in WHOLE_CALL:
                    bound.arguments.update(other)
                else:
                    bound.arguments[option.param] = other
        if lower is not None:
            _round_through(bound, lower)
        bound.arguments.update({k: iter(bound.arguments[k]) for k in passes})
        result = fn(*bound.args, **bound.kwargs)
        if lower is not None:
            result = _rounded_result(result, _floating_dtype(arguments), bound.arguments.get("out"), lower)
        for option, kind in reached:  # only calls that return: an invalid call has no right answer to mistake
            seen.setdefault(option, set()).add(kind)
        return result

    if where is None:
        return wrapper
    body = {where: staticmethod(wrapper) if where == "forward" else wrapper}
    return type(obj.__name__, (obj,), {**body, "__module__": obj.__module__, "__qualname__": obj.__qualname__})


def _floating_dtype(arguments: dict):
    """The dtype of the call's first floating-point tensor argument (or in a list of them), None if it has none."""
    flat = [x for v in arguments.values() for x in (v if isinstance(v, (list, tuple)) else (v,))]
    return next((v.dtype for v in flat if isinstance(v, torch.Tensor) and v.is_floating_point()), None)


def _round_through(bound, lower) -> None:
    """The call as if it carried its values in `lower`: its floating-point tensors of the inputs' dtype (in lists
    too) rounded through `lower`, computed in the inputs' dtype, so kernels with no `lower` path (bf16 in Triton's
    interpreter) run. (A given out= is rounded after the call, by _rounded_result.)"""
    dtype = _floating_dtype(bound.arguments)

    def through(value):
        if isinstance(value, torch.Tensor) and value.dtype == dtype:
            return value.to(lower).to(dtype)
        return type(value)(through(v) for v in value) if isinstance(value, (list, tuple)) else value

    for name, value in bound.arguments.items():
        if name != "out":
            bound.arguments[name] = through(value)


def _rounded_result(result, dtype, out, lower):
    """Results of the inputs' dtype rounded through `lower` (an fp32 rstd of 16-bit inputs stays as it is; a given
    out= rounded in place)."""
    if isinstance(result, torch.Tensor) and result.dtype == dtype:
        if result is out:
            return out.copy_(out.to(lower))
        return result.to(lower).to(dtype)
    if isinstance(result, (tuple, list)):
        return type(result)(_rounded_result(r, dtype, out, lower) for r in result)
    return result


def run_check(lesson: str, check, change: tuple[Option, str] | None, seen: dict) -> None:
    options = COUNTERFACTUALS[(lesson, check.name)]
    reference = ref(lesson)
    functions = []
    for use in check.uses:
        mine = [o for o in options if o.function == use]
        obj = getattr(reference, use)
        functions.append(answering(obj, mine, change, seen) if mine else obj)
    check.run(*functions, cases="all")


def _entries():
    for lesson in LESSONS:
        for check in checks_for(lesson):
            if (lesson, check.name) in COUNTERFACTUALS:
                yield pytest.param(lesson, check, id=f"{lesson}/{check.name}",
                                   marks=pytest.mark.xdist_group(f"registry_{lesson}"))


@pytest.mark.parametrize("lesson, check", list(_entries()))
def test_every_option_value_the_cases_reach_is_told_apart_from_another(lesson, check, monkeypatch):
    monkeypatch.setenv("MEMFIT_GRADING", "1")
    monkeypatch.setenv(HIDDEN_SEED_ENV, "0")
    if check.needs_gpu and not torch.cuda.is_available():
        pytest.skip("skipped: needs a GPU")
    seen: dict[str, set] = {}
    try:
        run_check(lesson, check, None, seen)
    except CheckSkipped as exc:
        pytest.skip(str(exc))
    blind, unreached = set(), []
    for option in COUNTERFACTUALS[(lesson, check.name)]:
        kinds = seen.get(option, set())
        unreached += [f"{option.name} = {k}" for k in option.kinds if k not in kinds]
        for kind in sorted(kinds):
            try:
                run_check(lesson, check, (option, kind), {})
            except (CheckFailed, LearnerCodeError):
                continue
            blind.add(f"{option.name} = {kind}")
    known = KNOWN_BLIND.get((lesson, check.name), set())
    assert not unreached, "no case reaches:\n  " + "\n  ".join(unreached)
    assert not blind - known, ("no case tells these apart (answered as another value, they keep the points):\n  "
                               + "\n  ".join(sorted(blind - known)))
    assert not known - blind, ("KNOWN_BLIND lists options a case now tells apart: remove them from "
                               "tests/counterfactuals.py\n  " + "\n  ".join(sorted(known - blind)))


def _options_of(obj) -> list[str]:
    where = _target(obj)
    fn = getattr(obj, where) if where else obj
    return [name for name, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty]


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_option_of_every_graded_function_has_a_counterfactual_or_a_reason(lesson):
    """An option: a parameter the def line gives a default (what a learner may leave out is a choice the text makes)."""
    covered = {(o.function, o.param) for (les, _), options in COUNTERFACTUALS.items() if les == lesson
               for o in options}
    missing = []
    for check in checks_for(lesson):
        for use in check.uses:
            for param in _options_of(getattr(ref(lesson), use)):
                if (use, param) not in covered and (use, param) not in EXEMPT:
                    missing.append(f"{check.name}: {use}({param})")
    assert not missing, "options with no counterfactual and no reason in EXEMPT:\n  " + "\n  ".join(sorted(set(missing)))


def test_a_counterfactual_changes_only_the_calls_of_its_kind():
    calls = []

    def f(x, alpha=1.0):
        calls.append(alpha)
        return x

    option = Option("f", "alpha", lambda v: "zero" if v == 0 else "other", lambda v, a: 7.0)
    seen: dict = {}
    g = answering(f, [option], (option, "zero"), seen)
    g(1, 0.0), g(1, 2.0), g(1)
    assert calls == [7.0, 2.0, 1.0] and seen == {option: {"zero", "other"}}
    assert inspect.signature(g) == inspect.signature(f)  # the def line's defaults stay visible (contract 6)


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_axis_of_every_check_has_a_counterfactual_or_a_reason(lesson):
    """Each axis the cases span (autograder/checks/<topic>.py's AXES) is a parameter or an axis of the whole call
    that the check's counterfactuals answer otherwise, or one that no other answer exists for (tests/counterfactuals.py:
    AXIS_PROOF and its reasons)."""
    module = importlib.import_module(checks_module(lesson))
    missing = []
    for check in checks_for(lesson):
        proven = {o.param for o in COUNTERFACTUALS.get((lesson, check.name), [])}
        proven |= {param for function, param in EXEMPT if function in check.uses}
        twin = MEMORY_TWINS.get(check.name)
        if twin:
            proven |= {o.param for o in COUNTERFACTUALS.get((lesson, twin), [])}
        for axis in module.AXES.get(check.name, {}):
            proof = axis_proof(check.name, axis)
            if proof is None:
                missing.append(f"{check.name}: axis {axis!r} is in no table: give it a counterfactual or a reason")
            elif proof not in REASONS and proof not in proven:
                missing.append(f"{check.name}: axis {axis!r} needs a counterfactual of {proof}")
    assert not missing, "\n  ".join(["axes with neither a counterfactual nor a reason:", *missing])
