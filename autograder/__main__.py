"""make grade: python -m autograder [--notebooks DIR | --submissions DIR] [--workers N] [--out DIR]

--notebooks DIR     grade DIR/NN_topic.ipynb as one student, named after the folder (default: lessons)
--submissions DIR   grade DIR/<student>/NN_topic.ipynb for every student
Exit status: 0 when every notebook could be graded (whatever its score), 2 when some could not.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from autograder.runner import grade
from autograder.summary import print_summary


def notebooks_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.ipynb") if not p.name.startswith("."))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--notebooks", type=Path, help="one folder of notebooks, graded as one student")
    source.add_argument("--submissions", type=Path, help="a folder with one subfolder of notebooks per student")
    parser.add_argument("--workers", type=int, default=0, help="checks run at once (default: 1 on a GPU, cores on CPU)")
    parser.add_argument("--out", type=Path, default=Path("grades"), help="where gradebook.csv and feedback/ go")
    args = parser.parse_args(argv)

    import memfit  # noqa: F401  (before anything imports triton)
    problems: list[str] = []
    students: dict[str, list[Path]] = {}
    if args.submissions is not None:
        if not args.submissions.is_dir():
            print(f"error: {args.submissions}: no such folder of submissions", file=sys.stderr)
            return 2
        for folder in sorted(p for p in args.submissions.iterdir() if p.is_dir() and not p.name.startswith(".")):
            found = notebooks_in(folder)
            if found:
                students[folder.name] = found
            else:
                problems.append(f"{folder}: no notebooks in this submission (expected files like 00_first_kernel.ipynb)")
    else:
        folder = args.notebooks or Path("lessons")
        if not folder.is_dir():
            print(f"error: {folder}: no such folder of notebooks", file=sys.stderr)
            return 2
        found = notebooks_in(folder)
        if found:
            students[folder.resolve().name] = found
        else:
            problems.append(f"{folder}: no notebooks to grade (expected files like 00_first_kernel.ipynb)")
    for p in problems:
        print(f"error: {p}", file=sys.stderr)

    workers = args.workers or (1 if memfit.HAS_GPU else (os.cpu_count() or 1))
    jobs = grade(students, args.out, workers)
    print_summary(jobs, args.out)
    problems += [j.problem for j in jobs if j.problem]
    if problems:
        print(f"{len(problems)} notebook(s) or folder(s) could not be graded; see the errors above.", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
