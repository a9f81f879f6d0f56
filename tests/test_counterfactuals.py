"""Cases that discriminate by construction: for every option of every graded function (tests/counterfactuals.py) and
every kind of value the check's cases give it, the reference answering those calls as if the option had another value
loses the check's points. A counterfactual that keeps them names an option no case can see, which a learner could
ignore and keep the points.

The check runs as the grader runs it (check.run(..., cases="all") under MEMFIT_GRADING=1, hidden seed 0): once with
the reference, recording the kinds each option receives, then once per option and kind with the counterfactual."""
from __future__ import annotations

import functools
import inspect

import pytest
import torch

from autograder.checks import CheckFailed, CheckSkipped, LearnerCodeError, checks_for
from autograder.checks.contracts import in_decoy
from autograder.checks.domain import HIDDEN_SEED_ENV
from tests.counterfactuals import COUNTERFACTUALS, DTYPE, EXEMPT, KNOWN_BLIND, NO_OTHER, Option, ref
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
        arguments = dict(bound.arguments)
        reached = []
        lower = None
        for option in options if not in_decoy() else ():  # a decoy's result is not compared with a right answer
            value = _floating_dtype(arguments) if option.param == DTYPE else arguments[option.param]
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
                else:
                    bound.arguments[option.param] = other
        result = fn(*bound.args, **bound.kwargs) if lower is None else _computed_in(fn, bound, lower)
        for option, kind in reached:  # only calls that return: an invalid call has no right answer to mistake
            seen.setdefault(option, set()).add(kind)
        return result

    if where is None:
        return wrapper
    body = {where: staticmethod(wrapper) if where == "forward" else wrapper}
    return type(obj.__name__, (obj,), {**body, "__module__": obj.__module__, "__qualname__": obj.__qualname__})


def _floating_dtype(arguments: dict):
    """The dtype of the call's first floating-point tensor argument, None if it has none."""
    return next((v.dtype for v in arguments.values() if isinstance(v, torch.Tensor) and v.is_floating_point()), None)


def _computed_in(fn, bound, lower):
    """fn as if it carried its values in `lower`: its floating-point tensors of the inputs' dtype rounded through
    `lower`, its results of that dtype too (an fp32 rstd of 16-bit inputs stays as it is; a given out= rounded in
    place). Computed in the inputs' dtype, so kernels that have no `lower` path (bf16 in Triton's interpreter) run."""
    dtype = _floating_dtype(bound.arguments)
    out = bound.arguments.get("out")
    for name, value in bound.arguments.items():
        if name != "out" and isinstance(value, torch.Tensor) and value.dtype == dtype:
            bound.arguments[name] = value.to(lower).to(dtype)

    def rounded(r):
        if isinstance(r, torch.Tensor) and r.dtype == dtype:
            if r is out:
                return out.copy_(out.to(lower))
            return r.to(lower).to(dtype)
        if isinstance(r, (tuple, list)):
            return type(r)(rounded(x) for x in r)
        return r

    return rounded(fn(*bound.args, **bound.kwargs))


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
