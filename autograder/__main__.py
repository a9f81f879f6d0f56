"""make grade: python -m autograder [--notebooks DIR | --submissions DIR] [--lessons NN ...] [--workers N] [--out DIR]

--notebooks DIR     grade DIR/NN_topic.ipynb as one student, named after the folder (default: lessons)
--submissions DIR   grade DIR/<student>/NN_topic.ipynb for every student
--lessons NN ...    only these lessons' notebooks (make grade LESSON=06): a number or a notebook's name
--seed N            the hidden seed of the drawn cases (make grade SEED=N); by default the gradebook's, or a new one
Each student x lesson runs in a fresh process under the limits autograder/sandbox.py describes. A notebook
already in the gradebook with the same bytes and the same grader keeps its rows, so an interrupted run
restarts where it stopped (--regrade grades everything again).
Exit status: 0 when every notebook could be graded (whatever its score), 2 when some could not.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autograder.runner import grade
from autograder.summary import print_summary


def notebooks_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.ipynb") if not p.name.startswith("."))


def lesson_filter(wanted: list[str] | None):
    """(keep(path), problem or None) for --lessons: "6", "06", "06_fused_linear_ce" or its .ipynb name."""
    if not wanted:
        return (lambda path: True), None
    known = sorted(p.stem for p in notebooks_in(Path(__file__).resolve().parent.parent / "solutions"))
    chosen, unknown = set(), []
    for name in wanted:
        stem = Path(name).stem
        match = [k for k in known if k == stem or (stem.isdigit() and k.split("_")[0] == f"{int(stem):02d}")]
        chosen.update(match)
        if not match:
            unknown.append(name)
    if unknown:
        return None, f"--lessons: no lesson {', '.join(map(repr, unknown))}; the lessons are {', '.join(known)}"
    return (lambda path: path.stem in chosen), None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--notebooks", type=Path, help="one folder of notebooks, graded as one student")
    source.add_argument("--submissions", type=Path, help="a folder with one subfolder of notebooks per student")
    parser.add_argument("--lessons", nargs="+", metavar="NN",
                        help="grade only these lessons (a number like 06, or a notebook's name)")
    parser.add_argument("--workers", type=int, default=0,
                        help="notebooks graded at once (default: one per GPU, or one per core without a GPU)")
    parser.add_argument("--out", type=Path, default=Path("grades"), help="where gradebook.csv and feedback/ go")
    parser.add_argument("--backend", choices=("local", "ray"), default="local",
                        help="ray: one Ray task per student x lesson (pip install ray; --ray-address or RAY_ADDRESS "
                             "names a running cluster, else a local one is started)")
    parser.add_argument("--ray-address", default=None, help="address of a running Ray cluster")
    parser.add_argument("--regrade", action="store_true", help="grade again notebooks the gradebook already has")
    parser.add_argument("--seed", type=int, default=None,
                        help="the hidden seed of the cases drawn from each exercise's domain (default: the "
                             "gradebook's, so a regrade gives the same grades; a new gradebook draws one)")
    parser.add_argument("--memory-gib", type=float, default=None,
                        help="host memory per grading process (default: the machine's share per worker, at most 16)")
    args = parser.parse_args(argv)

    keep, problem = lesson_filter(args.lessons)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2

    import memfit  # noqa: F401  (before anything imports triton)
    problems: list[str] = []
    students: dict[str, list[Path]] = {}
    if args.submissions is not None:
        if not args.submissions.is_dir():
            print(f"error: {args.submissions}: no such folder of submissions", file=sys.stderr)
            return 2
        for folder in sorted(p for p in args.submissions.iterdir() if p.is_dir() and not p.name.startswith(".")):
            found = [p for p in notebooks_in(folder) if keep(p)]
            if found:
                students[folder.name] = found
            else:
                problems.append(f"{folder}: no notebooks in this submission (expected files like 00_first_kernel.ipynb"
                                f"{', of the lessons asked for' if args.lessons else ''})")
    else:
        folder = args.notebooks or Path("lessons")
        if not folder.is_dir():
            print(f"error: {folder}: no such folder of notebooks", file=sys.stderr)
            return 2
        found = [p for p in notebooks_in(folder) if keep(p)]
        if found:
            students[folder.resolve().name] = found
        else:
            problems.append(f"{folder}: no notebooks to grade (expected files like 00_first_kernel.ipynb"
                            f"{', of the lessons asked for' if args.lessons else ''})")
    for p in problems:
        print(f"error: {p}", file=sys.stderr)

    if args.workers < 0:
        print(f"error: --workers must be 0 (automatic) or more, not {args.workers}", file=sys.stderr)
        return 2
    jobs = grade(students, args.out, args.workers, backend=args.backend, regrade=args.regrade,
                 memory_gib=args.memory_gib, ray_address=args.ray_address, seed=args.seed)
    print_summary(jobs, args.out)
    problems += [j.problem for j in jobs if j.problem]
    if problems:
        print(f"{len(problems)} notebook(s) or folder(s) could not be graded; see the errors above.", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
