"""The course layer: where the course's files are, and what every tool above the library shares (the environment
of a process that imports the course, loading a notebook's graded code as a module: course.notebook_loader).

It sits between memfit (the library learners import, which imports nothing above it) and the grader, the
benchmarks, the decks and the tools, which import it and not each other. ARCHITECTURE.md draws the layers."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def course_env(**extra: str) -> dict[str, str]:
    """The environment of a child process that imports the course (memfit, course, autograder, tools)."""
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
