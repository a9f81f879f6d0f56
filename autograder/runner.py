"""Grades notebooks: every check of every notebook in its own subprocess, with a time limit."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from autograder import course_env, feedback, gradebook
from autograder.checks import Check, checks_for
from autograder.gradebook import Row
from autograder.notebook_loader import LESSON_NAME, NotebookError, lesson_of, read_notebook

LOAD_ALLOWANCE_S = 90.0  # importing torch and running a notebook's cells, on top of a check's own limit
OUTPUT_TAIL = 600


@dataclass
class Job:
    student: str
    notebook: Path
    lesson: str
    checks: list[Check]
    problem: str | None = None  # why the notebook cannot be graded at all
    rows: list[Row] = field(default_factory=list)


def _has_gpu() -> bool:
    from memfit.runtime import HAS_GPU
    return HAS_GPU


def _tail(text: str) -> str:
    text = " ".join(text.strip().split())
    return text if len(text) <= OUTPUT_TAIL else "…" + text[-OUTPUT_TAIL:]


def run_check(notebook: Path, check: Check) -> tuple[str, str]:
    """(status, message) of one check, in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        result = Path(tmp) / "result.json"
        log = Path(tmp) / "output.txt"
        env = course_env(MPLBACKEND="Agg", PYTHONHASHSEED="0")
        limit = float(os.environ.get("MEMFIT_CHECK_TIMEOUT_S", check.timeout_s + LOAD_ALLOWANCE_S))
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "autograder.run_check", str(notebook.resolve()), check.name, str(result)],
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp, env=env,
                                    start_new_session=True)
            try:
                code = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return "timeout", (f"did not finish within {limit:g} s: look for an endless loop, a blocking call "
                                   "or a problem size far too large")
            finally:
                try:  # nothing the check started may outlive it
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if result.exists():
            data = json.loads(result.read_text())
            return data["status"], data["message"]
        reason = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        hint = " (out of memory?)" if code == -signal.SIGKILL else ""
        return "error", (f"the process running this check ended ({reason}{hint}) before the check finished: "
                         f"does the notebook call os._exit, sys.exit or crash? Output: {_tail(log.read_text(errors='replace'))}")


def _checks_or_none(lesson: str) -> list[Check]:
    """A lesson's checks, or none when the name is not a course lesson."""
    if not LESSON_NAME.match(lesson):
        return []
    try:
        return checks_for(lesson)
    except LookupError:
        return []


def plan(student: str, notebook: Path) -> Job:
    """What to grade in one notebook; a notebook that cannot be read becomes rows of errors."""
    try:
        lesson = lesson_of(read_notebook(notebook), notebook)
    except NotebookError as exc:  # rows for the checks of the lesson its file name claims
        return Job(student, notebook, notebook.stem, _checks_or_none(notebook.stem), problem=str(exc))
    checks = _checks_or_none(lesson)
    if not checks:
        return Job(student, notebook, lesson, [], problem=f"{notebook}: no checks exist for lesson {lesson}")
    return Job(student, notebook, lesson, checks)


def grade_job(job: Job, workers: int, progress) -> None:
    gpu = _has_gpu()

    def one(check: Check) -> Row:
        if job.problem:
            status, message = "error", job.problem
        elif check.needs_gpu and not gpu:
            status, message = "skipped", "skipped: needs a GPU"
        else:
            status, message = run_check(job.notebook, check)
        progress(f"{job.student}/{job.lesson}:{check.name} {status}")
        return Row(job.student, job.lesson, check.name, check.points if status == "passed" else 0.0,
                   check.points, status, message)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        job.rows = list(pool.map(one, job.checks))


class Progress:
    """A one-line progress bar on stderr (a line per step when stderr is not a terminal)."""

    def __init__(self, total: int):
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.tty = sys.stderr.isatty()

    def __call__(self, label: str) -> None:
        self.done += 1
        width = 30
        filled = width * self.done // max(1, self.total)
        elapsed = time.perf_counter() - self.start
        left = elapsed / self.done * (self.total - self.done)
        line = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} checks, ~{left:.0f} s left  {label}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
            if self.done == self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def grade(students: dict[str, list[Path]], out_dir: Path, workers: int) -> list[Job]:
    """Grade every student's notebooks; write the gradebook after each notebook and the feedback."""
    jobs = [plan(student, nb) for student, notebooks in students.items() for nb in notebooks]
    progress = Progress(sum(len(j.checks) for j in jobs))
    for job in jobs:
        if job.problem:
            print(f"error: {job.problem}", file=sys.stderr)
        grade_job(job, workers, progress)
        if job.rows:
            gradebook.merge(out_dir / "gradebook.csv", job.rows)
            feedback.write_feedback(out_dir / "feedback", job.student, job.lesson, job.rows)
    return jobs
