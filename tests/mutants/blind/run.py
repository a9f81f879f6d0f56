"""Run the blind set through the checks as the grader runs them (cases="all", MEMFIT_GRADING=1), in process.

    python -m tests.mutants.blind.run [LESSON ...] [--json FILE]
    BLIND_DIR=/path/to/held-out python -m tests.mutants.blind.run [LESSON ...]   (a set kept outside the repository)

prints, per lesson, each entry's outcome: a wrong entry "rejected" (CheckFailed, an error or a timeout: the
points are lost) or "SLIPPED" (it kept the points); a right entry "kept" or "REJECTED"; GPU-only checks "skipped"
on a machine without one. tests/test_blind_mutants.py asserts every wrong entry is rejected and every right one
kept.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import signal
import sys
import threading
import time

from autograder.checks import CheckFailed, CheckSkipped, checks_for
from course.lessons import topic
from tests.mutants.registry import LESSONS, functions_of, label

_LOADING = threading.Lock()


def blind_module(lesson: str):
    """The lesson's blind set: tests/mutants/blind/<topic>.py, or <topic>.py of the folder BLIND_DIR names (a held-out
    set kept outside the repository, in the same form)."""
    folder = os.environ.get("BLIND_DIR")
    if not folder:
        return importlib.import_module(f"tests.mutants.blind.{topic(lesson)}")
    if os.path.abspath(folder) in {os.path.abspath(p) for p in sys.path}:
        # on the path (PYTHONPATH=.:<the set>): imported by its own name, which a gloo rank's process resolves too
        # (a rank imports the class it runs by module name)
        return importlib.import_module(topic(lesson))
    name = f"held_out_blind_{topic(lesson)}_{abs(hash(os.path.abspath(folder)))}"  # one module per folder
    with _LOADING:  # --isolate's threads list entries at once: none may see a module half executed
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, os.path.join(folder, f"{topic(lesson)}.py"))
            sys.modules[name] = module = importlib.util.module_from_spec(spec)  # (dataclasses look it up)
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
    return sys.modules[name]


def entries(lesson: str):
    """(check, verdict, entry) for every entry of the lesson's BLIND table."""
    module = blind_module(lesson)
    checks = {c.name: c for c in checks_for(lesson)}
    for name, table in module.BLIND.items():
        for verdict in ("wrong", "right"):
            for entry in table.get(verdict, []):
                yield checks[name], verdict, entry


@contextlib.contextmanager
def _time_limit(seconds: float):
    def expire(*_):
        raise TimeoutError(f"ran past {seconds:.0f} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_entry(lesson: str, check, entry, slack: float = 1.0) -> tuple[str, str]:
    """(outcome, message): outcome is passed, failed, error, timeout or skipped."""
    fns = functions_of(lesson, check, entry, blind_module(lesson))
    try:
        with _time_limit(slack * check.timeout_s):  # slack: a test on a busy machine must not fail on speed
            check.run(*fns, cases="all")
    except CheckSkipped as exc:
        return "skipped", str(exc)
    except CheckFailed as exc:
        return "failed", str(exc)
    except TimeoutError as exc:
        return "timeout", str(exc)
    except Exception as exc:  # the grader records an error row: no points
        return "error", f"{type(exc).__name__}: {exc}"
    return "passed", ""


def _row(lesson, check, verdict, entry, outcome, message, seconds) -> dict:
    bad = (verdict == "wrong" and outcome == "passed") or (verdict == "right" and outcome not in ("passed", "skipped"))
    return dict(lesson=lesson, check=check.name, verdict=verdict, entry=label(entry), outcome=outcome,
                message=message[:300], seconds=round(seconds, 1), bad=bad)


def _show(row: dict) -> None:
    shown = {"wrong": {"passed": "SLIPPED"}, "right": {"passed": "kept"}}[row["verdict"]].get(
        row["outcome"], "skipped" if row["outcome"] == "skipped" else
        ("rejected" if row["verdict"] == "wrong" else "REJECTED"))
    print(f"{row['lesson']:20s} {row['check']:26s} {row['verdict']:5s} {row['entry']:45s} {shown:9s} "
          f"{row['seconds']:6.1f}s {row['message'][:110]}", flush=True)


def _context_lost() -> bool:
    """After a CUDA error such as an illegal address, every later CUDA call in this process fails."""
    import torch
    if not torch.cuda.is_available():
        return False
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
        return False
    except Exception:
        return True


def _indices(lesson: str, first: int, shard: tuple[int, int]) -> list[int]:
    """The entries of shard (i, k) of a lesson, from index `first` on: every k-th of those whose check --checks
    names (BLIND_CHECKS, inherited by --isolate's children; all when unset), starting at the i-th."""
    i, k = shard
    wanted = set(filter(None, os.environ.get("BLIND_CHECKS", "").split(",")))
    chosen = [index for index, (check, _, _) in enumerate(entries(lesson)) if not wanted or check.name in wanted]
    return [index for n, index in enumerate(chosen) if n % k == i and index >= first]


def run_lesson(lesson: str, first: int = 0, journal: str | None = None, shard: tuple[int, int] = (0, 1)) -> list[dict]:
    """Run the lesson's entries (those of `shard`, from index `first`) in this process; return their rows. With a
    journal (a file of JSON lines, for run_isolated), stop after an entry that lost the CUDA context: the caller
    goes on in a new process, so one wrong kernel cannot make the entries after it fail."""
    todo = list(entries(lesson))
    rows = []
    for index in _indices(lesson, first, shard):
        check, verdict, entry = todo[index]
        if journal:
            with open(journal, "a") as f:
                f.write(json.dumps({"started": index}) + "\n")
        start = time.perf_counter()
        outcome, message = run_entry(lesson, check, entry)
        rows.append(_row(lesson, check, verdict, entry, outcome, message, time.perf_counter() - start))
        _show(rows[-1])
        if journal:
            with open(journal, "a") as f:
                f.write(json.dumps({"index": index, **rows[-1]}) + "\n")
            if outcome == "error" and _context_lost():
                break
    return rows


def _journal(workdir: str, lesson: str, shard: tuple[int, int]) -> str:
    return os.path.join(workdir, f"{lesson}.{shard[0]}-of-{shard[1]}.jsonl")


def _read_journal(path: str) -> tuple[dict[int, dict], int | None]:
    """(rows by entry index, the index last started) of a journal."""
    rows, started = {}, None
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                if "started" in record:
                    started = record["started"]
                else:
                    rows[record.pop("index")] = record
    return rows, started


def run_isolated(lesson: str, shard: tuple[int, int], workdir: str) -> list[dict]:
    """One shard of the lesson's entries in as many processes as it takes: a new one after an entry that lost the
    CUDA context or crashed the process (that entry is recorded as an error, as the grader records it)."""
    import subprocess
    import sys
    journal = _journal(workdir, lesson, shard)
    todo = list(entries(lesson))
    first = 0
    while _indices(lesson, first, shard):
        proc = subprocess.run([sys.executable, "-m", "tests.mutants.blind.run", lesson, "--first", str(first),
                               "--journal", journal, "--shard", f"{shard[0]}/{shard[1]}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(proc.stdout[-20000:], end="", flush=True)
        rows, started = _read_journal(journal)
        if started is not None and started not in rows:  # the child ended inside this entry: it crashed
            check, verdict, entry = todo[started]
            row = _row(lesson, check, verdict, entry, "error", f"the process died (exit status {proc.returncode})", 0.0)
            _show(row)
            with open(journal, "a") as f:
                f.write(json.dumps({"index": started, **row}) + "\n")
            rows[started] = row
        if not rows:
            break
        first = max(rows) + 1
    return [row for _, row in sorted(_read_journal(journal)[0].items())]


def merged(workdir: str, lessons) -> list[dict]:
    """Every row the journals in workdir hold, lesson by lesson in entry order (also after a run was cut off)."""
    import glob
    rows = []
    for lesson in lessons:
        found = {}
        for path in glob.glob(os.path.join(workdir, f"{lesson}.*.jsonl")):
            found.update(_read_journal(path)[0])
        rows += [row for _, row in sorted(found.items())]
    return rows


def summary(rows: list[dict], lessons) -> None:
    for lesson in lessons:
        mine = [r for r in rows if r["lesson"] == lesson]
        wrong = [r for r in mine if r["verdict"] == "wrong" and r["outcome"] != "skipped"]
        right = [r for r in mine if r["verdict"] == "right" and r["outcome"] != "skipped"]
        print(f"{lesson}: {sum(r['bad'] for r in wrong)} of {len(wrong)} wrong entries slipped; "
              f"{sum(r['bad'] for r in right)} of {len(right)} right entries rejected; "
              f"{sum(r['outcome'] == 'skipped' for r in mine)} skipped (need a GPU)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lessons", nargs="*", default=list(LESSONS))
    parser.add_argument("--json", help="write every outcome to this file")
    parser.add_argument("--isolate", action="store_true",
                        help="(on a GPU) a new process after an entry that loses the CUDA context or crashes")
    parser.add_argument("--jobs", type=int, default=1, help="with --isolate: processes at once")
    parser.add_argument("--shards", type=int, default=1, help="with --isolate: split each lesson into this many")
    parser.add_argument("--workdir", help="with --isolate: keep the journals here (default: a temporary folder)")
    parser.add_argument("--merge", action="store_true", help="only read the journals in --workdir (a run cut off)")
    parser.add_argument("--checks", nargs="+", metavar="CHECK",
                        help="only the entries of these checks (a slow check's entries, say, that a cut-off run missed)")
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--journal", help=argparse.SUPPRESS)
    parser.add_argument("--shard", default="0/1", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["MEMFIT_GRADING"] = "1"  # skip() raises CheckSkipped, as under the grader
    if args.checks:
        os.environ["BLIND_CHECKS"] = ",".join(args.checks)
    if args.journal:  # a child of --isolate: its journal says how far it got
        (lesson,) = args.lessons
        run_lesson(lesson, args.first, args.journal, tuple(int(v) for v in args.shard.split("/")))
        return
    rows: list[dict] = []
    if args.isolate or args.merge:
        import tempfile
        from concurrent.futures import ThreadPoolExecutor
        workdir = args.workdir or tempfile.mkdtemp()
        os.makedirs(workdir, exist_ok=True)
        if not args.merge:
            tasks = [(lesson, (i, args.shards)) for lesson in args.lessons for i in range(args.shards)]
            with ThreadPoolExecutor(args.jobs) as pool:
                list(pool.map(lambda task: run_isolated(task[0], task[1], workdir), tasks))
        rows = merged(workdir, args.lessons)
    else:
        for lesson in args.lessons:
            rows += run_lesson(lesson)
    summary(rows, args.lessons)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
