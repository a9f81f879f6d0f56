"""Cases drawn from an exercise's whole domain, with a seed the gradebook keeps, and the smallest failing case shown.

A check's fixed cases (its visible and hidden tables) are the inputs someone thought of. Beside them, a check that
adopts this module declares its exercise's domain, every input the text allows, as axes:

    DOMAIN = {"rows": Sizes(1, 5000, edges=(1, 1023, 1024, 1025)), "dtype": Choice("float32", "float16"), ...}

and grades `drawn(DOMAIN, count)` more cases from it after its hidden ones, each run by the check's own
`check_one(case)`. The draw is reproducible: its seed is the class's hidden seed (`hidden_seed()`: MEMFIT_HIDDEN_SEED,
which `make grade` chooses once per gradebook and writes in it, so a regrade draws the same cases) mixed with the
check's name. A notebook's own cells run no drawn case: they are hidden cases.

When a drawn case fails, `shrink` looks for a smaller one that fails too (each axis toward its simplest value, in at
most MAX_SHRINK_STEPS tries: a count, not a time, so the message is the same on every machine), and the learner is
told the smallest failing case with that case's own message: "fails for rows=1025, dtype=float16: ...".
"""
from __future__ import annotations

import math
import os
import random
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator

from autograder.checks import CheckFailed, NotImplementedYet

HIDDEN_SEED_ENV = "MEMFIT_HIDDEN_SEED"
MAX_SHRINK_STEPS = 24  # runs of the check on smaller cases after a drawn case failed
EDGE_CHANCE = 0.35  # a drawn size is one of its axis's edges this often, else spread over the whole range


class Impossible(Exception):
    """A drawn combination the exercise's text does not allow (check_one raises it; the draw takes another)."""


@dataclass(frozen=True)
class Sizes:
    """An integer from lo to hi inclusive, widened to hold `edges`: the values where code tends to break (a block's
    size and its neighbours, 0, 1), drawn often. Drawn log-uniformly: small and large sizes alike."""
    lo: int
    hi: int
    edges: tuple[int, ...] = ()

    def __post_init__(self):
        # The range always holds its edges: an edge computed from a machine's kernel config (a GPU's larger block)
        # widens the range there rather than making the domain fail on that machine only.
        object.__setattr__(self, "lo", min(self.lo, *self.edges) if self.edges else self.lo)
        object.__setattr__(self, "hi", max(self.hi, *self.edges) if self.edges else self.hi)
        if self.lo > self.hi:
            raise ValueError(f"Sizes({self.lo}, {self.hi}): lo must not exceed hi")

    def draw(self, rng: random.Random) -> int:
        if self.edges and rng.random() < EDGE_CHANCE:
            return rng.choice(self.edges)
        low, high = math.log(self.lo + 1), math.log(self.hi + 1)
        return min(self.hi, max(self.lo, round(math.exp(rng.uniform(low, high))) - 1))

    def simpler(self, value: int) -> list[int]:
        """Smaller values to try, smallest first: lo, the edges below, halfway, one less."""
        options = [self.lo, *sorted(e for e in self.edges if e < value), self.lo + (value - self.lo) // 2, value - 1]
        return sorted({v for v in options if self.lo <= v < value})


@dataclass(frozen=True)
class Choice:
    """One of `values`, listed simplest first: shrinking tries the earlier ones."""
    values: tuple

    def __init__(self, *values):
        object.__setattr__(self, "values", tuple(values))

    def draw(self, rng: random.Random):
        return rng.choice(self.values)

    def simpler(self, value) -> list:
        return list(self.values[:self.values.index(value)])


Axis = Sizes | Choice


def hidden_seed() -> int:
    """The class's hidden seed: MEMFIT_HIDDEN_SEED under `make grade` (written in the gradebook), else 0."""
    raw = os.environ.get(HIDDEN_SEED_ENV, "0")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{HIDDEN_SEED_ENV}={raw!r}: the hidden seed must be an integer") from None


def _rng(check: str, seed: int) -> random.Random:
    return random.Random(zlib.crc32(check.encode()) * 1_000_003 + seed)


def draws(domain: dict[str, Axis], check: str, count: int, seed: int | None = None) -> Iterator[dict]:
    """`count` cases of `check` drawn from `domain` with the hidden seed (or `seed`): each a dict {axis: value}
    carrying its own "seed" too, for the random values of its tensors. The same for the same seed, on every machine."""
    rng = _rng(check, hidden_seed() if seed is None else seed)
    for _ in range(count):
        case = {axis: spec.draw(rng) for axis, spec in domain.items()}
        case["seed"] = rng.randrange(2**31)
        yield case


def describe(case: dict) -> str:
    return ", ".join(f"{axis}={value}" for axis, value in case.items() if axis != "seed")


def shrink(case: dict, domain: dict[str, Axis], failure: Callable[[dict], str | None]) -> tuple[dict, str | None]:
    """The smallest case found that still fails, and its message: each axis in turn moved to a simpler value while
    the case keeps failing, at most MAX_SHRINK_STEPS runs. failure(case) runs the check on one case: its message,
    or None when that case passes (or is Impossible)."""
    message = None
    steps = 0
    improved = True
    while improved and steps < MAX_SHRINK_STEPS:
        improved = False
        for axis, spec in domain.items():
            for value in spec.simpler(case[axis]):
                if steps >= MAX_SHRINK_STEPS:
                    break
                steps += 1
                trial = {**case, axis: value}
                found = failure(trial)
                if found is not None:
                    case, message, improved = trial, found, True
                    break
    return case, message


def grade_drawn(domain: dict[str, Axis], check: str, count: int, check_one: Callable[[dict], None]) -> None:
    """Run check_one on `count` drawn cases. The first that fails is shrunk, and the same kind of CheckFailed is
    raised with the smallest failing case and its message. A stub's NotImplementedYet and a skip pass through."""
    def failure(case: dict) -> str | None:
        try:
            check_one(case)
        except (Impossible, NotImplementedYet):
            return None
        except CheckFailed as exc:
            return str(exc)
        return None

    for case in draws(domain, check, count):
        try:
            check_one(case)
        except Impossible:
            continue
        except NotImplementedYet:
            raise
        except CheckFailed as exc:
            smallest, message = shrink(case, domain, failure)
            raise type(exc)(f"fails on a case drawn from the exercise's whole domain (hidden seed {hidden_seed()}); "
                            f"the smallest failing case found: {describe(smallest)}: {message or exc}") from None
