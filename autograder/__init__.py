"""The course's autograder: loads graded code from notebooks without a Jupyter server, grades each
student x lesson in its own process under time, memory and network limits, and writes a gradebook and feedback."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def course_env(**extra: str) -> dict[str, str]:
    """The environment of a child process that imports the course (memfit, autograder, tools)."""
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
