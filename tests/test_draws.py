"""Right answers keep their points on every draw of inputs, not only on the draw a test happened to see.

The checks draw their cases' random values from seeded generators (autograder.checks.numerics.seeded_generator); draw
0 is what the grader and the notebooks use, and `another_draw(n)` gives every case other, reproducible values. Each
right entry, registered (tests/mutants/registry.py) or blind (tests/mutants/blind/), of a check whose verdict
compares values keeps its points on the visible cases of many draws.

How many draws each check gets in `make test` is fixed here (a count that followed the machine's speed would make
the verdict depend on it): 100 where the visible cases run in PyTorch (a fraction of a second a draw), fewer where
they run Triton's interpreter. `MEMFIT_DRAWS=all` (make test-draws) gives every check that draws random values 100,
`MEMFIT_DRAWS=N` gives every one N (a quick look at a slow check).
"""
from __future__ import annotations

import importlib
import os

import pytest

from autograder.checks import CheckSkipped, checks_for
from autograder.checks.numerics import another_draw, seeds_drawn
from tests.mutants.blind.run import blind_module, entries
from tests.mutants.registry import LESSONS, REGISTRY, functions_of, label, mutant_module

ALL = 100
DRAWS = {  # check -> draws in make test (1 to 2 s of visible cases a draw at most, on one core here)
    "scaled_add_numerics": ALL, "pow4_numerics": ALL, "online_softmax": ALL, "cross_entropy_with_grad": ALL,
    "blockwise": ALL, "nf4": ALL, "lora_function": ALL,
    "adamw8bit_step": 10, "flash_forward": 10, "flash_delta": 10,
}


WANTED = os.environ.get("MEMFIT_DRAWS", "")
SPREAD = WANTED == "all" or WANTED.isdigit()
PARTS = 10 if SPREAD else 1  # make test-draws: each entry's draws in 10 parts, spread over every worker and GPU


def draws_of(check) -> int:
    return ALL if WANTED == "all" else int(WANTED) if WANTED.isdigit() else DRAWS.get(check.name, 0)


def right_entries():
    for lesson in LESSONS:
        for check in checks_for(lesson):
            found = [("registered", e, importlib.import_module(mutant_module(lesson)))
                     for e in REGISTRY[lesson][check.name]["right"]]
            found += [("blind", e, blind_module(lesson)) for c, verdict, e in entries(lesson)
                      if c.name == check.name and verdict == "right"]
            for kind, entry, module in found:
                for part in range(PARTS):
                    name = f"{lesson}/{check.name}/{kind}/{label(entry)}" + (f"/part{part}" if SPREAD else "")
                    marks = () if SPREAD else pytest.mark.xdist_group(f"draws_{lesson}")
                    yield pytest.param(lesson, check, entry, module, part, id=name, marks=marks)


def test_every_counted_check_exists():
    names = {c.name for lesson in LESSONS for c in checks_for(lesson)}
    assert set(DRAWS) <= names, set(DRAWS) - names


@pytest.mark.parametrize("lesson, check, entry, module, part", list(right_entries()))
def test_a_right_entry_keeps_its_points_on_every_draw(lesson, check, entry, module, part, monkeypatch):
    draws = draws_of(check)
    if not draws:
        pytest.skip("more than 2 s of visible cases a draw on a CPU: make test-draws draws it (MEMFIT_DRAWS=all)")
    numbers = [n for n in range(1, draws + 1) if n % PARTS == part]
    if not numbers:
        pytest.skip(f"draws {draws} < parts {PARTS}: nothing for part {part}")
    monkeypatch.setenv("MEMFIT_GRADING", "1")
    functions = functions_of(lesson, check, entry, module)
    before = seeds_drawn()
    try:
        check.run(*functions, cases="visible")
    except CheckSkipped as exc:
        pytest.skip(str(exc))
    if seeds_drawn() == before:
        assert check.name not in DRAWS, f"{check.name}'s cases draw no random values: a draw count here proves nothing"
        pytest.skip(f"{check.name}'s cases draw no random values: every draw is draw 0")
    for number in numbers:
        with another_draw(number):
            try:
                check.run(*functions, cases="visible")
            except AssertionError as exc:
                raise AssertionError(f"{label(entry)} lost {check.name}'s points on draw {number} of {draws}: "
                                     f"{exc}") from None
