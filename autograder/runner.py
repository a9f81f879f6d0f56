"""Grades a class: each student x lesson in a fresh process (autograder.child) under the limits of
autograder.sandbox, notebooks in parallel, the gradebook written atomically after each one.

A child runs a notebook's checks in order. When it hangs past a check's time limit, passes the memory limit,
crashes or loses its CUDA context, that check gets its row (timeout / error) and the checks after it run in a new
process. Rows already in the gradebook for the same notebook bytes and the same grader are kept, not regraded,
so an interrupted run restarts where it stopped.
"""
from __future__ import annotations

import hashlib
import os
import queue
import select
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path

from autograder import feedback, gradebook, sandbox
from course import ROOT, course_env
from autograder.checks import Check, checks_for, time_limit
from autograder.forkserver import ForkedChild, ForkServer, ForkServerError
from autograder.child import EXIT_CUDA_ERROR, verify
from autograder.gradebook import Row
from course.processes import kill_tree, resident_bytes
from memfit.notebook import LESSON_NAME, NotebookError, lesson_of, read_notebook

FORK_SERVER_ENV = "MEMFIT_FORK_SERVER"  # "0": start every child with a fresh interpreter (as on a GPU machine)
LOAD_ALLOWANCE_S = 90.0  # importing torch and running a notebook's cells, before the first check starts
CPU_TIME_FACTOR = 2.0  # RLIMIT_CPU: this many CPU seconds per thread per second of the wall-time budget
OUTPUT_TAIL = 600
POLL_S = 0.25


@dataclass
class Job:
    student: str
    notebook: Path
    lesson: str
    checks: list[Check]
    problem: str | None = None  # why the notebook cannot be graded at all
    fingerprint: str = ""
    rows: list[Row] = field(default_factory=list)
    reused: bool = False  # rows taken from the gradebook of an earlier run


@dataclass
class Settings:
    workers: int
    limits: sandbox.Limits
    gpus: list[str]  # CUDA device ids, one worker each (several workers share a GPU round-robin)
    check_timeout_s: str | None = None  # overrides checks' own limits (MEMFIT_CHECK_TIMEOUT_S: checks.time_limit)
    cell_timeout_s: float = 60.0
    out_dir: Path = Path("grades")
    references: dict[str, Path] = field(default_factory=dict)  # lesson -> its values of autograder.checks.references
    fork_server: bool = False  # fork children from a pre-imported process (autograder.forkserver; CPU machines)
    hidden_seed: int = 0  # the drawn cases' seed (autograder/checks/domain.py), one per gradebook


def _has_gpu() -> bool:
    from memfit.runtime import HAS_GPU
    return HAS_GPU


def settings_for(workers: int, out_dir: Path, memory_gib: float | None = None) -> Settings:
    """Workers default to one per GPU, or one per core without a GPU; each child gets its share of the cores."""
    from memfit.runtime import cpu_share
    gpus = []
    if _has_gpu():
        import torch
        gpus = [str(i) for i in range(torch.cuda.device_count())]
    workers = workers or len(gpus) or cpu_share()
    per_gpu = -(-workers // len(gpus)) if gpus else 0
    memory = int(memory_gib * 2**30) if memory_gib else sandbox.default_memory_bytes(workers)
    limits = sandbox.Limits(memory_bytes=memory, cpu_seconds=None,
                            gpu_fraction=round(0.95 / per_gpu, 3) if gpus else None,
                            threads=max(1, cpu_share() // workers))
    return Settings(workers, limits, gpus, os.environ.get("MEMFIT_CHECK_TIMEOUT_S") or None,
                    float(os.environ.get("MEMFIT_CELL_TIMEOUT_S", 60)), out_dir,
                    fork_server=not gpus and os.environ.get(FORK_SERVER_ENV) != "0")


def _tail(text: str) -> str:
    text = " ".join(text.strip().split())
    return text if len(text) <= OUTPUT_TAIL else "…" + text[-OUTPUT_TAIL:]


# ------------------------------------------------------------------------------ what a notebook is

def _source_digest() -> str:
    """The grader's and the course library's code and the released lessons: a change regrades everything."""
    h = hashlib.sha256()
    for pattern in ("autograder/**/*.py", "memfit/**/*.py", "lessons/*.ipynb"):
        for path in sorted(ROOT.glob(pattern)):
            h.update(str(path.relative_to(ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


GRADER_DIGEST = _source_digest()


def fingerprint(notebook: Path, hidden_seed: int = 0) -> str:
    h = hashlib.sha256(f"{GRADER_DIGEST} seed {hidden_seed}".encode())
    try:
        h.update(notebook.read_bytes())
    except OSError as exc:
        h.update(repr(exc).encode())
    return h.hexdigest()[:16]


def _checks_or_none(lesson: str) -> list[Check]:
    """A lesson's checks, or none when the name is not a course lesson."""
    if not LESSON_NAME.match(lesson):
        return []
    try:
        return checks_for(lesson)
    except LookupError:
        return []


def plan(student: str, notebook: Path, hidden_seed: int = 0) -> Job:
    """What to grade in one notebook; a notebook that cannot be read becomes rows of errors."""
    fp = fingerprint(notebook, hidden_seed)
    try:
        lesson = lesson_of(read_notebook(notebook), notebook)
    except NotebookError as exc:  # rows for the checks of the lesson its file name claims
        return Job(student, notebook, notebook.stem, _checks_or_none(notebook.stem), problem=str(exc), fingerprint=fp)
    checks = _checks_or_none(lesson)
    if not checks:
        return Job(student, notebook, lesson, [], problem=f"{notebook}: no checks exist for lesson {lesson}",
                   fingerprint=fp)
    return Job(student, notebook, lesson, checks, fingerprint=fp)


# ---------------------------------------------------------------------------------- one child process

@dataclass
class Stop:
    """Why a child stopped before reporting every check: the check it was running (None: while loading)."""
    check: str | None
    status: str
    message: str


class Interrupted(Exception):
    """The run was interrupted (Ctrl-C, SIGTERM): a notebook being graded records no rows."""


_LIVE: set[subprocess.Popen] = set()  # the children now running, stopped on an interrupt
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


def _stop_everything() -> None:
    _STOPPING.set()
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        _kill(proc)
    close_fork_servers()
    # Every process this run started, whatever it is doing (a fork server still importing torch, a reference
    # computation): each wait on one of them then ends at once.
    kill_tree(os.getpid(), spare_root=True)


def _kill(proc: subprocess.Popen) -> None:
    kill_tree(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_child(notebook: Path, lesson: str, checks: list[Check], settings: Settings, gpu: str | None,
              on_result=lambda name, status: None) -> tuple[dict[str, tuple[str, str]], Stop | None]:
    """Run `checks` of one notebook in one child. Returns {check: (status, message)} and why it stopped early."""
    key = os.urandom(32)
    limits = settings.limits
    budget = LOAD_ALLOWANCE_S + sum(time_limit(c, settings.check_timeout_s) for c in checks)
    limits = sandbox.Limits(limits.memory_bytes, int(CPU_TIME_FACTOR * limits.threads * budget) + 60,
                            limits.gpu_fraction, limits.threads)
    env = child_env(settings, gpu)
    if lesson in settings.references:
        env["MEMFIT_REFERENCES"] = str(settings.references[lesson])
    results: dict[str, tuple[str, str]] = {}
    argv = [str(notebook.resolve()), lesson, ",".join(c.name for c in checks)]
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        log_path = Path(tmp) / "output.txt"
        read_end, write_end = os.pipe()
        with log_path.open("w") as log:
            proc = _fork(argv, env, tmp, limits, settings, key, log.fileno(), write_end) if settings.fork_server \
                else None
            if proc is None:
                proc = subprocess.Popen(
                    [*namespaces_of(settings).prefix(), sys.executable, "-m", "autograder.child", *argv, str(write_end)],
                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, cwd=tmp, env=env,
                    pass_fds=(write_end,), preexec_fn=sandbox.preexec(limits, address_space_limit=not settings.gpus))
                try:
                    proc.stdin.write(key.hex().encode() + b"\n")
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
        os.close(write_end)
        with _LIVE_LOCK:
            _LIVE.add(proc)
        if _STOPPING.is_set():  # an interrupt came while it started: it must not outlive the run
            _kill(proc)
        stop = _watch(proc, read_end, key, checks, settings, results, on_result)
        _kill(proc)  # nothing the child started may outlive it
        proc.wait()
        with _LIVE_LOCK:
            _LIVE.discard(proc)
        os.close(read_end)
        if stop is None and len(results) < len(checks) and proc.returncode != EXIT_CUDA_ERROR:
            stop = Stop(_running(checks, results), "error", _ended(proc.returncode, log_path))
    return results, stop


def child_env(settings: Settings, gpu: str | None) -> dict[str, str]:
    """The environment of every grading child (and of the fork server, which must match it)."""
    threads = str(settings.limits.threads)
    env = course_env(MPLBACKEND="Agg", PYTHONHASHSEED="0", MEMFIT_THREADS=threads, OMP_NUM_THREADS=threads,
                     MEMFIT_CELL_TIMEOUT_S=str(settings.cell_timeout_s), MEMFIT_GRADES_DIR=str(settings.out_dir.resolve()),
                     MEMFIT_HIDDEN_SEED=str(settings.hidden_seed))
    if namespaces_of(settings).network:  # only loopback exists in the child's namespace: gloo must not pick the hostname's NIC
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if settings.limits.gpu_fraction:
        env["MEMFIT_GPU_FRACTION"] = str(settings.limits.gpu_fraction)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def namespaces_of(settings: Settings) -> sandbox.Namespaces:
    """The OS isolation of this run's children, probed once per grades folder (which must exist to be bound
    read-only: it is made now, a little before the first gradebook is written into it)."""
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    return sandbox.namespaces(str(settings.out_dir.resolve()))


_SERVERS: dict[int, ForkServer] = {}  # worker thread -> its fork server
_SERVERS_LOCK = threading.Lock()


def _fork(argv, env, cwd, limits, settings, key, log_fd, result_fd) -> ForkedChild | None:
    """A child forked by this worker's server (started on first use, restarted once if it died), or None."""
    for _attempt in range(2):
        with _SERVERS_LOCK:
            server = _SERVERS.get(threading.get_ident())
        try:
            if server is None:
                server = ForkServer(child_env(settings, None), namespaces_of(settings).prefix())
                with _SERVERS_LOCK:
                    _SERVERS[threading.get_ident()] = server
            return server.spawn(argv, env, cwd, limits, not settings.gpus, key, log_fd, result_fd)
        except (ForkServerError, OSError):
            if server is not None:
                server.close()
            with _SERVERS_LOCK:
                _SERVERS.pop(threading.get_ident(), None)
    return None  # the runner starts a fresh interpreter instead


def close_fork_servers() -> None:
    with _SERVERS_LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.close()


NATIVE_CRASHES = (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS)


def _ended(code: int, log_path: Path) -> str:
    """Why a child died, in words that are the same every time (a crash's own text is not: glibc's heap checks
    word the same corruption differently from run to run, so only an exit's output is quoted)."""
    if code < 0:
        sig = signal.Signals(-code)
        if sig in NATIVE_CRASHES:  # one corruption ends in any of them: the name varies from run to run
            return ("the process running this check crashed in native code (SIGSEGV, SIGABRT or SIGBUS) before the "
                    "check finished; under Triton's interpreter an unmasked load or store past the end of a tensor "
                    "corrupts memory like this")
        hint = {signal.SIGKILL: " (out of memory?)", signal.SIGXCPU: " (its CPU-time limit)"}.get(sig, "")
        return f"the process running this check was killed by signal {sig.name}{hint} before the check finished"
    return (f"the process running this check ended (exit status {code}) before the check finished: does the notebook "
            f"call os._exit, sys.exit or crash? Output: {_tail(log_path.read_text(errors='replace'))}")


def _running(checks: list[Check], results: dict, started: set | None = None) -> str | None:
    """The check a child was running: the first started one without a result (None if it had not loaded)."""
    for c in checks:
        if c.name not in results and (started is None or c.name in started):
            return c.name
    return None


def _watch(proc, fd, key, checks, settings, results, on_result) -> Stop | None:
    """Read the child's signed lines until it exits; stop it when a limit is passed."""
    limit_of = {c.name: time_limit(c, settings.check_timeout_s) for c in checks}
    started: set[str] = set()
    loaded, current, since = False, None, time.monotonic()
    buffer = b""
    memory = settings.limits.memory_bytes
    next_memory_poll = 0.0
    while True:
        if _STOPPING.is_set():  # interrupted: the run records nothing of this notebook
            _kill(proc)
            return Stop(current, "error", "the run was interrupted")
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:  # the child closed the pipe: it is exiting
                proc.wait()
                return None
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                record = verify(key, line.decode(errors="replace"))
                if record is None:
                    continue
                if record["event"] == "loaded":
                    loaded, since = True, time.monotonic()
                elif record["event"] == "start" and record.get("check") in limit_of:
                    current, since = record["check"], time.monotonic()
                    started.add(current)
                elif record["event"] == "result" and record.get("check") in limit_of:
                    results[record["check"]] = (record["status"], record["message"])
                    on_result(record["check"], record["status"])
                    current, since = None, time.monotonic()
        now = time.monotonic()
        if current is not None and now - since > limit_of[current]:
            _kill(proc)
            return Stop(current, "timeout", f"did not finish within {limit_of[current]:g} s: look for an endless loop, "
                                             "a blocking call or a problem size far too large")
        load_limit = LOAD_ALLOWANCE_S + 3 * settings.cell_timeout_s
        if not loaded and now - since > load_limit:
            _kill(proc)
            return Stop(None, "timeout", f"the notebook did not load within {load_limit:g} s (its cells, each "
                                         f"stopped after {settings.cell_timeout_s:g} s, and the imports)")
        if memory and now >= next_memory_poll:
            next_memory_poll = now + 1.0
            used = resident_bytes(proc.pid)
            if used > memory:
                _kill(proc)
                return Stop(_running(checks, results, started), "error",
                            f"used {used / 2**30:.1f} GiB of host memory, more than the grader's limit of "
                            f"{memory / 2**30:.1f} GiB per notebook: the grader stopped it")
        if proc.poll() is not None and not ready:
            # exited; drain what is left in the pipe on the next turn, then EOF ends the loop
            ready2, _, _ = select.select([fd], [], [], 0)
            if not ready2:
                return None


def grade_file(student: str, lesson: str, notebook: Path, problem: str | None, fingerprint: str, settings: Settings,
               gpu: str | None) -> list[Row]:
    """Every row of one student x lesson from the notebook at `notebook` (what a Ray task runs on its node)."""
    return grade_notebook(Job(student, notebook, lesson, _checks_or_none(lesson), problem, fingerprint), settings, gpu)


def grade_notebook(job: Job, settings: Settings, gpu: str | None = None, progress=lambda label: None) -> list[Row]:
    """Every row of one student x lesson: children until each check has a result."""
    gpu_here = bool(settings.gpus)
    results: dict[str, tuple[str, str]] = {}
    for check in job.checks:
        if job.problem:
            results[check.name] = ("error", job.problem)
        elif check.needs_gpu and not gpu_here:
            results[check.name] = ("skipped", "skipped: needs a GPU")
    for name in results:
        progress(f"{job.student}/{job.lesson}:{name} {results[name][0]}")
    pending = [c for c in job.checks if c.name not in results]
    while pending:
        got, stop = run_child(job.notebook, job.lesson, pending, settings, gpu,
                              on_result=lambda name, status: progress(f"{job.student}/{job.lesson}:{name} {status}"))
        if _STOPPING.is_set():  # its rows would hold the kill, not the notebook's grade: record none
            raise Interrupted(f"{job.student}/{job.lesson}")
        results.update(got)
        if stop is not None:
            victims = [stop.check] if stop.check else [c.name for c in pending if c.name not in results]
            for name in victims:
                if name not in results:
                    results[name] = (stop.status, stop.message)
                    progress(f"{job.student}/{job.lesson}:{name} {stop.status}")
        left = [c for c in pending if c.name not in results]
        if len(left) == len(pending):  # no progress at all: never loop
            for c in left:
                results[c.name] = ("error", "grader error, please report it: the grading process reported nothing")
                progress(f"{job.student}/{job.lesson}:{c.name} error")
            left = []
        pending = left
    return [Row(job.student, job.lesson, c.name, c.points if results[c.name][0] == "passed" else 0.0, c.points,
                results[c.name][0], results[c.name][1], job.fingerprint, str(settings.hidden_seed)) for c in job.checks]


# ------------------------------------------------------------------------------------------ the class

class Progress:
    """A one-line progress bar on stderr (a line per step when stderr is not a terminal), with the time left."""

    def __init__(self, total: int):
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.lock = threading.Lock()

    def __call__(self, label: str) -> None:
        with self.lock:
            self.done += 1
            width = 30
            filled = width * self.done // max(1, self.total)
            elapsed = time.perf_counter() - self.start
            left = elapsed / self.done * (self.total - self.done)
            line = (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} checks, "
                    f"{_clock(elapsed)} elapsed, ~{_clock(left)} left  {label}")
            if self.tty:
                sys.stderr.write("\r\033[K" + line)
                if self.done == self.total:
                    sys.stderr.write("\n")
            else:
                sys.stderr.write(line + "\n")
            sys.stderr.flush()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else f"{seconds // 60}:{seconds % 60:02d}"


def reuse_graded(jobs: list[Job], book: Path) -> None:
    """Take the rows of notebooks graded before (same fingerprint, a row for every check) from the gradebook."""
    earlier: dict[tuple[str, str], list[Row]] = {}
    for row in gradebook.read(book):
        earlier.setdefault((row.student, row.lesson), []).append(row)
    for job in jobs:
        rows = earlier.get((job.student, job.lesson), [])
        if rows and all(r.fingerprint == job.fingerprint for r in rows) and \
                sorted(r.check for r in rows) == sorted(c.name for c in job.checks):
            order = {c.name: i for i, c in enumerate(job.checks)}
            job.rows, job.reused = sorted(rows, key=lambda r: order[r.check]), True


REFERENCE_TIMEOUT_S = 900.0
REFERENCE_MIN_NOTEBOOKS = 4  # computing a lesson's references once costs about what 3 notebooks would spend on them


def compute_references(lessons: list[str], settings: Settings) -> dict[str, Path]:
    """The values every student's checks share (autograder.checks.references), computed once per lesson in a
    trusted process that loads no notebook, and kept in the grades folder for a restarted run."""
    from autograder.checks.references import lessons_with_references
    import torch
    folder = settings.out_dir / ".references" / f"{GRADER_DIGEST[:16]}-torch{torch.__version__}"
    wanted = {lesson: folder / f"{lesson}.pkl" for lesson in lessons_with_references(lessons)}
    missing = [lesson for lesson, path in wanted.items() if not path.exists()]
    if missing:
        folder.mkdir(parents=True, exist_ok=True)
        print(f"computing the reference values of {', '.join(missing)} once for the class", file=sys.stderr)
    threads = str(settings.limits.threads)  # the children's thread count: the same floating-point sums

    def one(lesson: str) -> None:
        try:
            done = subprocess.run([sys.executable, "-m", "autograder.checks.references", lesson, str(wanted[lesson])],
                                  env=course_env(MEMFIT_THREADS=threads, OMP_NUM_THREADS=threads, MPLBACKEND="Agg"),
                                  cwd=ROOT, capture_output=True, text=True, timeout=REFERENCE_TIMEOUT_S)
            if done.returncode != 0:
                print(f"warning: the reference values of {lesson} could not be computed (each check computes its "
                      f"own): {_tail(done.stderr)}", file=sys.stderr)
        except subprocess.TimeoutExpired:
            print(f"warning: the reference values of {lesson} took over {REFERENCE_TIMEOUT_S:g} s; each check "
                  "computes its own", file=sys.stderr)

    with ThreadPoolExecutor(max_workers=max(1, settings.workers)) as pool:
        list(pool.map(one, missing))
    return {lesson: path for lesson, path in wanted.items() if path.exists()}


def record(job: Job, out_dir: Path, lock: threading.Lock) -> None:
    with lock:
        gradebook.merge(out_dir / "gradebook.csv", job.rows)
        feedback.write_feedback(out_dir / "feedback", job.student, job.lesson, job.rows)


def class_seed(book: Path, seed: int | None) -> int:
    """The hidden seed of this grading: the one asked for, else the gradebook's (a regrade draws the same cases,
    so gives the same grades), else a new one for a new gradebook."""
    if seed is not None:
        return seed
    kept = gradebook.hidden_seed(gradebook.read(book)) if book.exists() else None
    return kept if kept is not None else secrets.randbelow(2**31)


def grade(students: dict[str, list[Path]], out_dir: Path, workers: int, backend: str = "local",
          regrade: bool = False, memory_gib: float | None = None, ray_address: str | None = None,
          seed: int | None = None) -> list[Job]:
    """Grade every student's notebooks; the gradebook is merged and written after each notebook."""
    settings = settings_for(workers, out_dir, memory_gib)
    settings.hidden_seed = class_seed(out_dir / "gradebook.csv", seed)
    print(f"hidden seed {settings.hidden_seed} (the drawn cases; --seed {settings.hidden_seed} draws them again)",
          file=sys.stderr)
    jobs = [plan(student, nb, settings.hidden_seed) for student, notebooks in students.items() for nb in notebooks]
    if not regrade:
        reuse_graded(jobs, out_dir / "gradebook.csv")
    todo = [j for j in jobs if not j.reused]
    if len(todo) < len(jobs):
        print(f"{len(jobs) - len(todo)} notebook(s) already graded (same file, same grader): kept their rows "
              "(--regrade grades them again)", file=sys.stderr)
    for job in todo:
        if job.problem:
            print(f"error: {job.problem}", file=sys.stderr)
    if backend == "local":  # (a Ray task may run on another machine: its checks compute their references in place)
        counts = Counter(j.lesson for j in todo if j.checks and not j.problem)
        settings.references = compute_references(sorted(l for l, n in counts.items() if n >= REFERENCE_MIN_NOTEBOOKS),
                                                 settings)
    progress = Progress(sum(len(j.checks) for j in todo))
    lock = threading.Lock()
    if backend == "ray":
        from autograder.ray_backend import grade_on_ray
        grade_on_ray(todo, settings, progress, lambda job: record(job, out_dir, lock), grade_file, ray_address)
        return jobs
    slots: queue.Queue = queue.Queue()
    for i in range(settings.workers):
        slots.put(settings.gpus[i % len(settings.gpus)] if settings.gpus else None)

    def one(job: Job) -> None:
        if _STOPPING.is_set():
            return
        gpu = slots.get()
        try:
            job.rows = grade_notebook(job, settings, gpu, progress)
        finally:
            slots.put(gpu)
        record(job, out_dir, lock)

    def on_term(_signum, _frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C interrupts even where SIGINT came in ignored (a job started with `&` by a non-interactive shell, as CI
    # and scripts do): Python installs its KeyboardInterrupt handler only when SIGINT was at its default.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    pool = ThreadPoolExecutor(max_workers=settings.workers)
    futures = []
    try:
        futures = [pool.submit(one, job) for job in todo]
        for future in futures:
            future.result()
    except (KeyboardInterrupt, Interrupted):
        # The children run in sessions of their own, so Ctrl-C reaches only this process: stop them, keep the
        # rows of the notebooks already recorded, and let a restart grade the rest. A worker may be starting a
        # process as the signal comes: kill again until every worker has returned.
        _stop_everything()
        pool.shutdown(wait=False, cancel_futures=True)
        while futures and wait_futures(futures, timeout=0.5).not_done:
            kill_tree(os.getpid(), spare_root=True)
        close_fork_servers()  # one a worker started after the interrupt, too
        print("\ninterrupted: the gradebook holds every notebook graded so far; run the same command again to "
              "grade the rest", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    pool.shutdown()
    close_fork_servers()
    return jobs
