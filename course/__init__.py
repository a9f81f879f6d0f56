"""The course layer: where the course's files are and what every package above the library shares: the environment
of a process that imports the course, the lessons (course.lessons), what grading adds to loading a notebook
(course.notebook_loader), a process and everything it started (course.processes).

It sits between memfit (the library learners import, which imports nothing above it) and the grader, the
benchmarks, the decks and the tools. ARCHITECTURE.md draws the layers."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def course_env(**extra: str) -> dict[str, str]:
    """The environment of a child process that imports the course (memfit, course, autograder, tools)."""
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
