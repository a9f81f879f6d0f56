"""Grading a generated class on this machine: how long it takes, and whether an interrupted run ends where an
uninterrupted one does.

    python -m benchmarks.grading [--students 100] [--workers 2] [--seed 0] [--lessons all] [--kill-at 0.5]
                                 [--work DIR [--run uninterrupted|interrupted]]

1. tests.make_class writes the class (reference, stub and mutant cells mixed, every lesson by default): the tests'
   generator, whose mutants live in tests/mutants/.
2. An uninterrupted `python -m autograder --submissions ... --workers N`, timed.
3. The same class into a new gradebook, the grader and all its processes killed (SIGKILL) once the given share
   of the notebooks is in the gradebook, then restarted; the two runs timed.
4. The gradebooks compared row by row, and the generator's expected outcomes against the rows.
With --work the class, gradebooks and timings are kept, and --run does one of the two runs: on a 2-core machine 100
students take longer than one session, so the runs can be made apart, with the same grader code (its digest is
recorded with each run and must match).
Writes benchmarks/results/<machine>-<date>-grading.{md,json}. CPU grading is the point: run it with no GPU (or
CUDA_VISIBLE_DEVICES= ).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from course import ROOT, course_env
from course.processes import kill_tree

RESULTS = ROOT / "benchmarks" / "results"


def _grader(subs: Path, out: Path, workers: int) -> list[str]:
    return [sys.executable, "-m", "autograder", "--submissions", str(subs), "--workers", str(workers), "--out", str(out),
            "--seed", "0"]  # (one hidden seed for every run: their gradebooks compare row for row)


def _grade(subs: Path, out: Path, workers: int) -> None:
    subprocess.run(_grader(subs, out, workers), cwd=ROOT, env=course_env(), check=False, stdout=subprocess.DEVNULL)


def _rows(out: Path) -> list[dict]:
    with open(out / "gradebook.csv", newline="") as f:
        return list(csv.DictReader(f))


def _notebooks_graded(out: Path) -> int:
    try:
        return len({(r["student"], r["lesson"]) for r in _rows(out)})
    except (OSError, csv.Error, KeyError):
        return 0


def machine_facts() -> dict:
    import torch
    import triton
    return dict(machine="CPU", cores=os.cpu_count(), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), date=datetime.date.today().isoformat(),
                processor=platform.processor() or platform.machine())


def _digest() -> str:
    """The grader's digest (runner.GRADER_DIGEST): both runs must grade with the same code to be compared."""
    out = subprocess.run([sys.executable, "-c", "from autograder.runner import GRADER_DIGEST; print(GRADER_DIGEST)"],
                         cwd=ROOT, env=course_env(), capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _class_digest(subs: Path) -> str:
    """The class's notebooks, byte for byte: runs made apart (a class regenerated in another session) must
    grade the same submissions."""
    h = hashlib.sha256()
    for path in sorted(subs.glob("*/*.ipynb")):
        h.update(str(path.relative_to(subs)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def run(students: int, workers: int, seed: int, lessons: str | None, kill_at: float, work: Path,
        runs: tuple[str, ...] = ("uninterrupted", "interrupted")) -> dict | None:
    """Grade the class in `work` (made there first); returns the result once both runs are in `work`, else None.

    The runs may happen in different sessions: each is timed into work/timings.json with the grader's digest."""
    subs = work / "class"
    if not (subs / "manifest.json").exists():
        make = [sys.executable, "-m", "tests.make_class", str(subs), "--students", str(students), "--seed", str(seed)]
        subprocess.run(make + (["--lessons", lessons] if lessons else []), cwd=ROOT, env=course_env(), check=True)
    manifest = json.loads((subs / "manifest.json").read_text())
    notebooks = sum(1 for _ in subs.glob("*/*.ipynb"))
    timings_path = work / "timings.json"
    timings = json.loads(timings_path.read_text()) if timings_path.exists() else {}
    digest, class_digest = _digest(), _class_digest(subs)
    stamp = {"digest": digest, "class": class_digest, "commit": _commit(), "workers": workers}  # on each run's timing
    for other in [r for r in timings if r not in runs]:
        if (timings[other]["digest"], timings[other].get("class")) != (digest, class_digest):
            print(f"{work}: the {other} run graded with other code or another class; its timing is dropped: "
                  f"make it again", file=sys.stderr)
            del timings[other]

    if "uninterrupted" in runs:
        shutil.rmtree(work / "a", ignore_errors=True)  # a run starts from no gradebook (an old one would be resumed)
        started = time.perf_counter()
        _grade(subs, work / "a", workers)
        timings["uninterrupted"] = dict(seconds=round(time.perf_counter() - started, 1), **stamp,
                                        facts=machine_facts())
        timings_path.write_text(json.dumps(timings, indent=1))

    if "interrupted" in runs:
        shutil.rmtree(work / "b", ignore_errors=True)  # else the rows of an earlier run count toward the kill point
        started = time.perf_counter()
        proc = subprocess.Popen(_grader(subs, work / "b", workers), cwd=ROOT, env=course_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        while proc.poll() is None and _notebooks_graded(work / "b") < kill_at * notebooks:
            time.sleep(0.5)
        graded_at_kill = _notebooks_graded(work / "b")
        kill_tree(proc.pid)
        proc.wait()
        first_s = time.perf_counter() - started
        started = time.perf_counter()
        _grade(subs, work / "b", workers)
        timings["interrupted"] = dict(killed_after_s=round(first_s, 1), graded_at_kill=graded_at_kill,
                                      restart_s=round(time.perf_counter() - started, 1), **stamp,
                                      facts=machine_facts())
        timings_path.write_text(json.dumps(timings, indent=1))

    if not {"uninterrupted", "interrupted"} <= timings.keys():
        return None
    first, second = timings["uninterrupted"], timings["interrupted"]
    a, b = _rows(work / "a"), _rows(work / "b")
    key = lambda r: tuple(r.values())  # noqa: E731  (fingerprints included: the same notebook bytes and grader)
    differing = sorted(set(map(key, a)) ^ set(map(key, b)))
    same_grader = first["digest"] == second["digest"]
    grade = lambda r: (r["student"], r["lesson"], r["check"], r["points"], r["status"])  # noqa: E731
    rows_differing = len({r[:3] for r in differing})
    grades_differing = len({g[:3] for g in {grade(r) for r in a} ^ {grade(r) for r in b}})
    statuses: dict[str, int] = {}
    for r in a:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return dict(students=students, workers=workers, seed=seed, notebooks=notebooks, rows=len(a),
                generated=manifest.get("summary", {}), statuses=statuses,
                points=sum(float(r["points"]) for r in a),
                max_points=sum(float(r["max_points"]) for r in a if r["status"] != "skipped"),
                uninterrupted_s=first["seconds"], killed_after_s=second["killed_after_s"],
                graded_at_kill=second["graded_at_kill"], restart_s=second["restart_s"],
                same_grader=same_grader, commits=[first["commit"], second["commit"]],
                gradebooks_equal=not differing and same_grader,
                rows_differing=rows_differing, grades_differing=grades_differing,
                differing_rows=differing[:20], expected=_against_manifest(manifest, a))


def _against_manifest(manifest: dict, rows: list[dict]) -> dict:
    """How many of the generator's definite predictions ("keeps points" / "loses points") the rows bear out."""
    got = {(r["student"], r["lesson"], r["check"]): float(r["points"]) > 0 for r in rows}
    agree = disagree = 0
    misses = []
    for student, entry in manifest.get("class", {}).items():
        for lesson, lesson_entry in entry.get("lessons", {}).items():
            for check, info in lesson_entry.get("checks", {}).items():
                expected = info.get("expected") if isinstance(info, dict) else None
                if expected not in ("keeps points", "loses points") or (student, lesson, check) not in got:
                    continue
                if got[(student, lesson, check)] == (expected == "keeps points"):
                    agree += 1
                else:
                    disagree += 1
                    misses.append(f"{student}/{lesson}/{check}: expected {expected}")
    return dict(agree=agree, disagree=disagree, misses=misses[:20])


def _inequality(r: dict) -> str:
    if not r["same_grader"]:
        return "NO: the runs used different grader code"
    return (f"NO: {r['rows_differing']} of {r['rows']} rows differ, {r['grades_differing']} of them in points or "
            "status (the JSON lists them)")


def markdown(r: dict, facts: dict) -> str:
    return "\n".join([
        f"# Grading a generated class on {facts['machine']} ({facts['cores']} cores)",
        "",
        f"torch {facts['torch']}, triton {facts['triton']}, Python {facts['python']}, {facts['date']}; "
        f"`python -m benchmarks.grading --students {r['students']} --workers {r['workers']} --seed {r['seed']}`; "
        f"commit {' and '.join(sorted(set(r['commits'])))}",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| students x lessons (notebooks) | {r['students']} x {r['notebooks'] // max(1, r['students'])} ({r['notebooks']}) |",
        f"| gradebook rows | {r['rows']} ({', '.join(f'{k} {v}' for k, v in sorted(r['statuses'].items()))}) |",
        f"| points graded on this machine | {r['points']:g} of {r['max_points']:g} |",
        f"| uninterrupted, WORKERS={r['workers']} | {r['uninterrupted_s']:.0f} s ({r['uninterrupted_s'] / max(1, r['students']):.1f} s per student) |",
        f"| interrupted run: killed (SIGKILL, whole tree) after | {r['killed_after_s']:.0f} s, {r['graded_at_kill']} notebooks in the gradebook |",
        f"| restarted run | {r['restart_s']:.0f} s |",
        f"| both runs graded by the same grader code (digest) | {'yes' if r['same_grader'] else 'NO'} |",
        f"| final gradebook equals the uninterrupted one | {'yes' if r['gradebooks_equal'] else _inequality(r)} |",
        f"| generator's predictions borne out | {r['expected']['agree']} of {r['expected']['agree'] + r['expected']['disagree']} |",
        "",
    ])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grading", description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lessons", default=None, help="comma-separated lesson names (default: all)")
    parser.add_argument("--kill-at", type=float, default=0.5, help="share of notebooks graded before the kill")
    parser.add_argument("--work", type=Path, default=None,
                        help="keep the class, gradebooks and timings here (default: a temporary folder)")
    parser.add_argument("--run", choices=("both", "uninterrupted", "interrupted"), default="both",
                        help="one run only, the other from an earlier call with the same --work (and grader)")
    args = parser.parse_args(argv)
    facts = machine_facts()
    runs = ("uninterrupted", "interrupted") if args.run == "both" else (args.run,)
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
        result = run(args.students, args.workers, args.seed, args.lessons, args.kill_at, args.work, runs)
    else:
        with tempfile.TemporaryDirectory(prefix="grading-bench-") as tmp:
            result = run(args.students, args.workers, args.seed, args.lessons, args.kill_at, Path(tmp), runs)
    if result is None:
        print(f"{args.work}: {', '.join(runs)} run done; run the other with the same --work to compare them")
        return 0
    stem = RESULTS / f"cpu-{facts['date']}-grading-{args.students}-students"
    stem.with_suffix(".json").write_text(json.dumps(dict(facts=facts, result=result), indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(result, facts))
    print(markdown(result, facts))
    return 0 if result["gradebooks_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
