"""The grader's child process: one student x lesson, its checks one after another.

    python -m autograder.child NOTEBOOK LESSON CHECK[,CHECK...] RESULT_FD   (a key of 64 hex digits on stdin)

Started by autograder.runner, which applies the OS limits (autograder.sandbox). The child imports the grader,
installs the in-process guards, loads the notebook once and runs the named checks in order. For each check it
writes a signed line "start" and then "result" to the pipe RESULT_FD, so the parent knows which check was
running if the process dies, hangs or runs out of memory, and grades the rest in a new process. After a CUDA
error the child exits at once (the context is lost for everything after it).
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

os.environ["MEMFIT_GRADING"] = "1"  # a skipped check raises instead of printing (autograder.checks.skip)

import memfit  # noqa: E402,F401  (decides TRITON_INTERPRET before any notebook imports triton)
from memfit.runtime import cpu_share  # noqa: E402

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


def run_check(check, loaded, cases: str = "all") -> tuple[str, str]:
    """(status, message) of one check on a loaded notebook."""
    from autograder.checks import CheckFailed, CheckSkipped, LearnerCodeError, NotImplementedYet
    missing = [name for name in check.uses if not callable(getattr(loaded.module, name, None))]
    if missing:
        broken = "; ".join(map(str, loaded.errors))
        return "error", (f"the notebook defines no function {', '.join(missing)}: was its cell deleted, renamed or "
                         "broken?" + (f" Cells that failed to run: {broken}" if broken else ""))
    functions = [getattr(loaded.module, name) for name in check.uses]
    try:
        check.run(*functions, cases=cases)
    except CheckSkipped as exc:
        return "skipped", str(exc)
    except (NotImplementedYet, CheckFailed) as exc:
        return ("error" if isinstance(exc, LearnerCodeError) else "failed"), str(exc)
    except BaseException as exc:  # noqa: BLE001  (SystemExit, KeyboardInterrupt from learner code too)
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return "error", f"the check stopped with {last}"
    return "passed", "passed"


def visible_or_hidden(check, loaded, spent_s: float) -> str:
    """Whether the failure is one the notebook's own check cell shows: the visible cases run again (when the first
    run left time for it: a check must not pass its limit for a message). "" when there was no time."""
    from autograder.checks import time_limit
    limit = time_limit(check, os.environ.get("MEMFIT_CHECK_TIMEOUT_S"))
    if spent_s > limit / 3:
        return ""
    status, _ = run_check(check, loaded, cases="visible")
    if status == "failed":
        return " (The notebook's check cell under the exercise fails too: it shows a visible case.)"
    if status == "passed":
        return (" (A hidden case: the notebook's visible cases pass; this one differs from them in sizes or "
                "values, not in kind.)")
    return ""


def main(argv: list[str], key: bytes | None = None) -> int:
    """Grade; `key` signs the results (read from stdin when not given: autograder.forkserver gives it)."""
    notebook, lesson, names, fd = argv[0], argv[1], argv[2].split(","), int(argv[3])
    key = key if key is not None else bytes.fromhex(sys.stdin.readline().strip())
    out = os.fdopen(fd, "w", buffering=1)

    def report(**record) -> None:
        out.write(sign(key, record) + "\n")
        out.flush()

    from autograder import sandbox
    from autograder.checks import checks_for
    import course.notebook_loader as loader
    from course.notebook_loader import NotebookError, load_notebook, locked_cell_problems, release_of, test_cell_ids
    from memfit.meter import install_reset_guards

    checks = {c.name: c for c in checks_for(lesson)}
    if os.environ.get("MEMFIT_REFERENCES"):  # values the runner computed once for the class (checks.references)
        from autograder.checks import references
        try:
            references.load(os.environ["MEMFIT_REFERENCES"])
        except Exception:  # noqa: BLE001  (unreadable: each check computes its values in place, as without one)
            pass
    try:  # the lesson's reference, imported now so its file can be guarded (checks use it for their expected values)
        __import__(f"memfit.from_lessons.{lesson.split('_', 1)[1]}")
    except ImportError:
        pass
    try:  # read before the guards: a notebook may lie in solutions/ (make grade NOTEBOOKS=solutions)
        nb, unreadable = loader.read_notebook(notebook), None
    except NotebookError as exc:
        nb, unreadable = None, exc
    release = release_of(lesson)
    try:
        solution = loader.read_notebook(loader.solution_path(lesson))
    except NotebookError:
        solution = None
    sandbox.cap_gpu_memory(float(os.environ["MEMFIT_GPU_FRACTION"]) if os.environ.get("MEMFIT_GPU_FRACTION") else None)
    sandbox.limit_threads(int(os.environ.get("MEMFIT_THREADS", "0")) or cpu_share())
    sandbox.fill_uninitialized_memory()
    install_reset_guards()
    memfit.profile()  # its cache is set before the snapshot, so that setting it is not a change
    sandbox.install_guards(lesson, [os.environ[k] for k in ("MEMFIT_GRADES_DIR",) if os.environ.get(k)])
    gc.freeze()  # the imports' 177k objects are never garbage: each gc.collect() of the meter took 0.1 s for them
    before = sandbox.snapshot()

    try:
        if unreadable:
            raise unreadable
        notes = {}
        if release is not None:
            for problem in locked_cell_problems(nb, release, solution):
                notes[problem.split()[2]] = (f" (Note: {problem}; the grader ignores the notebook's test cells and "
                                             "runs its own checks.)")
        loaded = load_notebook(notebook, cell_timeout_s=float(os.environ.get("MEMFIT_CELL_TIMEOUT_S", 60)),
                               test_ids=test_cell_ids(release), nb=nb)
    except NotebookError as exc:
        for name in names:
            report(event="result", check=name, status="error", message=str(exc))
        return 0
    report(event="loaded")
    tampered = sandbox.changes(before)
    for name in names:
        report(event="start", check=name)
        if tampered:
            report(event="result", check=name, status="error", message=tamper_message(tampered))
            continue
        sandbox.fill_uninitialized_memory()
        started = time.monotonic()
        status, message = run_check(checks[name], loaded)
        if status == "failed":
            message += visible_or_hidden(checks[name], loaded, time.monotonic() - started)
        tampered = sandbox.changes(before)
        if tampered:
            status, message = "error", tamper_message(tampered)
        cuda_lost = _cuda_broken(None) if status != "passed" else False
        report(event="result", check=name, status=status, message=message + notes.get(name, ""))
        if cuda_lost:
            return EXIT_CUDA_ERROR
    return 0


def tamper_message(changed: list[str]) -> str:
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    return (f"the notebook changed what the grader relies on ({shown}): graded code may not patch torch, "
            "numpy or the grader, so this check scores 0")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
