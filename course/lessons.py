"""The course's lessons, found where they live: a lesson is a solution notebook, solutions/NN_topic.ipynb.

Everything else about a lesson follows from its name, by convention, so adding one registers it nowhere:
its learner's release lessons/NN_topic.ipynb (make lessons), its checks autograder/checks/topic.py (CHECKS, the
cases, the kernels), its mutants tests/mutants/topic.py, its benchmark benchmarks/topic.py (if it has one: make
bench runs every one there is), its deck slides/decks/NN_topic.md, its row in the README's lesson table.
"""
from __future__ import annotations

from pathlib import Path

from course import ROOT


def lessons() -> list[str]:
    """Every lesson's name, in order: ["00_first_kernel", "01_model_states", ...]."""
    return sorted(p.stem for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


def this_and_later(lesson: str) -> list[str]:
    """The lesson and every lesson after it (every lesson, for a name that is none): whose answers graded code of
    `lesson` may not use."""
    order = lessons()
    return order[order.index(lesson):] if lesson in order else order


def topic(lesson: str) -> str:
    """'00_first_kernel' -> 'first_kernel': the name of its check, mutant and benchmark modules."""
    return lesson.split("_", 1)[1]


def solution_path(lesson: str) -> Path:
    return ROOT / "solutions" / f"{lesson}.ipynb"


def reference_path(lesson: str) -> Path:
    """Where make lessons writes the lesson's reference code (its #@save cells): memfit/from_lessons/topic.py."""
    return ROOT / "memfit" / "from_lessons" / f"{topic(lesson)}.py"


def checks_module(lesson: str) -> str:
    return f"autograder.checks.{topic(lesson)}"


def benchmark_module(lesson: str) -> str | None:
    """benchmarks.<topic> where the lesson has a benchmark, else None."""
    return f"benchmarks.{topic(lesson)}" if (ROOT / "benchmarks" / f"{topic(lesson)}.py").exists() else None
