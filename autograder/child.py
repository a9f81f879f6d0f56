"""The grader's child process: one student x lesson, its checks one after another.

    python -m autograder.child NOTEBOOK LESSON CHECK[,CHECK...] RESULT_FD   (a key of 64 hex digits on stdin)

Started by autograder.runner inside the OS limits and namespaces of autograder.sandbox. The child runs STARTUP, a
list of named steps in the order they must run (each says why it sits where it does): it imports the grader, reads
the notebook, puts up the in-process guards and takes the integrity snapshot. Then it loads the notebook once and
runs the named checks in order. For each check it writes a signed line "start" and then "result" to the pipe
RESULT_FD, so the parent knows which check was running if the process dies, hangs or runs out of memory, and grades
the rest in a new process. After a CUDA error the child exits at once (the context is lost for everything after it).
"""
from __future__ import annotations

import gc
import hashlib
import hmac
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

os.environ["MEMFIT_GRADING"] = "1"  # a skipped check raises instead of printing (autograder.checks.skip)

import memfit  # noqa: E402,F401  (decides TRITON_INTERPRET before any notebook imports triton)
from memfit.runtime import cpu_share  # noqa: E402
from autograder import answers, sandbox  # noqa: E402
from course.lessons import topic  # noqa: E402

EXIT_CUDA_ERROR = 3  # the parent grades the remaining checks in a fresh process


def sign(key: bytes, record: dict) -> str:
    body = json.dumps(record, sort_keys=True)
    return json.dumps({"body": body, "mac": hmac.new(key, body.encode(), hashlib.sha256).hexdigest()})


def verify(key: bytes, line: str) -> dict | None:
    """The record of a line the child signed, or None for anything else (printed or forged text)."""
    try:
        outer = json.loads(line)
        body, mac = outer["body"], outer["mac"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(body, str) or not isinstance(mac, str):
        return None
    good = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
    return json.loads(body) if hmac.compare_digest(good, mac) else None


def _cuda_broken(exc: BaseException | None) -> bool:
    """Was the CUDA context lost (illegal address, device-side assert)? Later checks could not run in it."""
    import torch
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    if exc is not None and "CUDA error" in str(exc):
        return True
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001
        return True
    return False


def run_check(check, loaded, cases: str = "all", as_the_notebook: bool = False) -> tuple[str, str]:
    """(status, message) of one check on a loaded notebook (as_the_notebook: as its check cell runs it, the kernels
    not compiled for a GPU). "refused": every case passed and a kernel does not compile for a GPU; the gradebook
    records it as failed, with no note on visible or hidden cases (the check cell compiles nothing, and passes)."""
    from autograder.checks import CheckFailed, CheckSkipped, KernelRefused, LearnerCodeError
    missing = [name for name in check.uses if not callable(getattr(loaded.module, name, None))]
    if missing:
        broken = "; ".join(map(str, loaded.errors))
        return "error", (f"the notebook defines no function {', '.join(missing)}: was its cell deleted, renamed or "
                         "broken?" + (f" Cells that failed to run: {broken}" if broken else ""))
    functions = [getattr(loaded.module, name) for name in check.uses]
    if answers.sealed():
        reached = answers.answer_used(*functions)
        if reached:
            return "error", reached
        answers.forget()
    try:
        check.run(*functions, cases=cases, compile_kernels=not as_the_notebook)
        status, message = "passed", "passed"
    except CheckSkipped as exc:
        status, message = "skipped", str(exc)
    except LearnerCodeError as exc:  # a NameError may come from a cell that failed to run
        broken = "; ".join(map(str, loaded.errors))
        status, message = "error", str(exc) + (f" (Cells that failed to run: {broken})" if broken else "")
    except KernelRefused as exc:
        status, message = "refused", str(exc)
    except CheckFailed as exc:  # NotImplementedYet too
        status, message = "failed", str(exc)
    except BaseException as exc:  # noqa: BLE001  (SystemExit, KeyboardInterrupt from learner code too)
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        status, message = "error", f"the check stopped with {last}"
    if answers.used():  # graded code called a reference it may not use (whether or not it caught what that raised)
        return "error", answers.used()
    return status, message


def visible_or_hidden(check, loaded, spent_s: float) -> str:
    """Whether the failure is one the notebook's own check cell shows: the visible cases run again (when the first
    run left time for it: a check must not pass its limit for a message). "" when there was no time."""
    from autograder.checks import time_limit
    limit = time_limit(check, os.environ.get("MEMFIT_CHECK_TIMEOUT_S"))
    if spent_s > limit / 3:
        return ""
    status, _ = run_check(check, loaded, cases="visible", as_the_notebook=True)
    if status == "failed":
        return " (The notebook's check cell under the exercise fails too: it shows a visible case.)"
    if status == "passed":
        return (" (A hidden case: the notebook's visible cases pass; this one differs from them in sizes or "
                "values, not in kind.)")
    return ""


# ================================================================================= start-up

@dataclass
class Grading:
    """One child's job, and what the start-up steps hand on to the grading."""
    notebook: str
    lesson: str
    names: list[str]
    report: Callable[..., None]  # writes one signed line to the result pipe
    checks: dict = field(default_factory=dict)
    nb: dict | None = None
    unreadable: Exception | None = None  # the notebook could not be read: every check gets this error
    release: dict | None = None
    solution: dict | None = None
    before: object = None  # sandbox.snapshot() taken before the notebook runs


def import_checks(g: Grading) -> None:
    from autograder.checks import checks_for
    g.checks = {c.name: c for c in checks_for(g.lesson)}


def load_references(g: Grading) -> None:
    if os.environ.get("MEMFIT_REFERENCES"):  # values the runner computed once for the class (checks.references)
        from autograder.checks import references
        try:
            references.load(os.environ["MEMFIT_REFERENCES"])
        except Exception:  # noqa: BLE001  (unreadable: each check computes its values in place, as without one)
            pass


def import_lesson_reference(g: Grading) -> None:
    try:  # the checks compute their expected values with it
        __import__(f"memfit.from_lessons.{topic(g.lesson)}")
    except ImportError:
        pass


def read_notebooks(g: Grading) -> None:
    """The notebook, the lesson's release (its locked cells) and its solution (what a locked cell should hold)."""
    from memfit.notebook import NotebookError, read_notebook
    from course.lessons import solution_path
    from course.notebook_loader import release_of
    try:
        g.nb = read_notebook(g.notebook)
    except NotebookError as exc:
        g.unreadable = exc
    g.release = release_of(g.lesson)
    try:
        g.solution = read_notebook(solution_path(g.lesson))
    except NotebookError:
        g.solution = None


def seal_answers(g: Grading) -> None:
    answers.seal(g.lesson)


def cap_gpu_memory(g: Grading) -> None:
    sandbox.cap_gpu_memory(float(os.environ["MEMFIT_GPU_FRACTION"]) if os.environ.get("MEMFIT_GPU_FRACTION") else None)


def limit_threads(g: Grading) -> None:
    sandbox.limit_threads(int(os.environ.get("MEMFIT_THREADS", "0")) or cpu_share())


def fill_uninitialized_memory(g: Grading) -> None:
    sandbox.fill_uninitialized_memory()


def guard_meter_resets(g: Grading) -> None:
    from memfit.meter import install_reset_guards
    install_reset_guards()


def cache_hardware_profile(g: Grading) -> None:
    memfit.profile()


def install_audit_hook(g: Grading) -> None:
    """Blocks the grader's files, non-loopback sockets and frame / heap introspection from notebook code."""
    sandbox.install_guards(g.lesson, [os.environ[k] for k in ("MEMFIT_GRADES_DIR",) if os.environ.get(k)])


def freeze_imports(g: Grading) -> None:
    gc.freeze()


def take_snapshot(g: Grading) -> None:
    g.before = sandbox.snapshot()


class Step(NamedTuple):
    run: Callable[[Grading], None]
    why_here: str


STARTUP = (
    Step(import_checks, "first: the grader's modules must be in memory before reads of autograder/ are blocked"),
    Step(load_references, "the class's shared values are read from the grades folder, blocked later"),
    Step(import_lesson_reference, "the checks' reference code, imported before its file is blocked"),
    Step(read_notebooks, "before the guards: the notebook may lie in solutions/ (make grade NOTEBOOKS=solutions)"),
    Step(seal_answers, "after every import of the checks and their references, before any notebook code runs: the "
                       "references of this lesson and the later ones leave sys.modules (autograder.answers)"),
    Step(cap_gpu_memory, "before anything touches the GPU: the cap binds from the first allocation"),
    Step(limit_threads, "before any notebook code runs torch: its thread count is fixed for the grading"),
    Step(fill_uninitialized_memory, "before the notebook allocates: its fresh memory is NaN too (again per check)"),
    Step(guard_meter_resets, "before the snapshot: the guards are then part of what must not change"),
    Step(cache_hardware_profile, "before the snapshot: filling its cache later is not a change"),
    Step(install_audit_hook, "after every file the grader reads: from here on they cannot be opened"),
    Step(freeze_imports, "after the imports: gc.collect() in the meter no longer walks their objects (0.1 s each)"),
    Step(take_snapshot, "last: what the notebook may not change, as it is just before the notebook runs"),
)


# ================================================================================= grading

def main(argv: list[str], key: bytes | None = None) -> int:
    """Grade; `key` signs the results (read from stdin when not given: autograder.forkserver gives it)."""
    notebook, lesson, names, fd = argv[0], argv[1], argv[2].split(","), int(argv[3])
    key = key if key is not None else bytes.fromhex(sys.stdin.readline().strip())
    out = os.fdopen(fd, "w", buffering=1)

    def report(**record) -> None:
        out.write(sign(key, record) + "\n")
        out.flush()

    g = Grading(notebook, lesson, names, report)
    for step in STARTUP:
        step.run(g)
    loaded, notes = load(g)
    return grade_checks(g, loaded, notes) if loaded is not None else 0


def load(g: Grading):
    """The notebook's graded cells as a module, and a note per check whose locked cell was edited; (None, {}) when it
    cannot be loaded (each check then reports why)."""
    from memfit.notebook import NotebookError, load_notebook
    from course.notebook_loader import locked_cell_problems, test_cell_ids
    try:
        if g.unreadable:
            raise g.unreadable
        notes = {}
        if g.release is not None:
            for problem in locked_cell_problems(g.nb, g.release, g.solution):
                notes[problem.split()[2]] = (f" (Note: {problem}; the grader ignores the notebook's test cells and "
                                             "runs its own checks.)")
        loaded = load_notebook(g.notebook, cell_timeout_s=float(os.environ.get("MEMFIT_CELL_TIMEOUT_S", 60)),
                               test_ids=test_cell_ids(g.release), nb=g.nb)
    except NotebookError as exc:
        for name in g.names:
            g.report(event="result", check=name, status="error", message=str(exc))
        return None, {}
    g.report(event="loaded")
    return loaded, notes


def grade_checks(g: Grading, loaded, notes: dict[str, str]) -> int:
    """Each named check in order, a "start" line before it and a "result" line after; from the first change to what
    the grader relies on, every check scores 0."""
    tampered = sandbox.changes(g.before)
    for name in g.names:
        g.report(event="start", check=name)
        if tampered:
            g.report(event="result", check=name, status="error", message=tamper_message(tampered))
            continue
        sandbox.fill_uninitialized_memory()
        started = time.monotonic()
        status, message = run_check(g.checks[name], loaded)
        if status == "failed":
            message += visible_or_hidden(g.checks[name], loaded, time.monotonic() - started)
        status = "failed" if status == "refused" else status
        tampered = sandbox.changes(g.before)
        if tampered:
            status, message = "error", tamper_message(tampered)
        cuda_lost = _cuda_broken(None) if status != "passed" else False
        g.report(event="result", check=name, status=status, message=message + notes.get(name, ""))
        if cuda_lost:
            return EXIT_CUDA_ERROR
    return 0


def tamper_message(changed: list[str]) -> str:
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    return (f"the notebook changed what the grader relies on ({shown}): graded code may not patch torch, "
            "numpy or the grader, so this check scores 0")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
