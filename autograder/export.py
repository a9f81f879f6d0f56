"""python -m autograder.export [--gradebook grades/gradebook.csv] [--nbgrader-csv grades/nbgrader_export.csv]
[--lms-csv grades/totals.csv]

Exports grades/gradebook.csv in two shapes:
- the CSV of `nbgrader export` (nbgrader's CsvExportPlugin): one row per student x lesson, the lesson being the
  assignment; a student with no rows for a lesson gets score 0 out of that lesson's max, as nbgrader does for a
  missing submission;
- a per-student totals table for an LMS: student, one column of points per lesson, total, max_total, percent.

Checks that were skipped (they need a GPU the grading machine lacked) count towards no total and no maximum.
A lesson's maximum is the points that were graded (not skipped) for it: the largest such sum over the students
that have rows for it, so the same for every student. Both files are written atomically. Exit status 2 when the
gradebook is missing or cannot be read.
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from autograder.gradebook import GradebookError, Row, read_strict

# The columns and their order of nbgrader's CsvExportPlugin (nbgrader/plugins/export.py, nbgrader 0.9.6);
# tests/test_export.py compares them with the header nbgrader itself writes.
NBGRADER_COLUMNS = ("assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email",
                    "raw_score", "late_submission_penalty", "score", "max_score")

def _entry(row) -> Row:
    """A gradebook.Row from a Row, any object with the same attributes, or a mapping (a csv.DictReader row)."""
    if isinstance(row, Row):
        return row
    get = row.__getitem__ if isinstance(row, Mapping) else (lambda name: getattr(row, name))
    return Row(str(get("student")), str(get("lesson")), str(get("check")), float(get("points")),
               float(get("max_points")), str(get("status")), "")


read_gradebook = read_strict  # the rows, or GradebookError naming the problem


def _num(x: float) -> str:
    return f"{x:g}"


@dataclass
class _Totals:
    lessons: list[str]                         # sorted
    students: list[str]                        # sorted
    earned: dict[tuple[str, str], float]       # (student, lesson) -> points, only for students with rows
    graded: dict[tuple[str, str], float]       # (student, lesson) -> max points graded (skipped excluded)
    lesson_max: dict[str, float]               # lesson -> max points graded, the same for every student


def _totals(rows: Iterable) -> _Totals:
    earned: dict[tuple[str, str], float] = {}
    graded: dict[tuple[str, str], float] = {}
    for entry in map(_entry, rows):
        key = (entry.student, entry.lesson)
        earned.setdefault(key, 0.0)
        graded.setdefault(key, 0.0)
        if entry.status == "skipped":
            continue
        earned[key] += entry.points
        graded[key] += entry.max_points
    lessons = sorted({lesson for _, lesson in earned})
    students = sorted({student for student, _ in earned})
    lesson_max = {lesson: max(v for (_, l), v in graded.items() if l == lesson) for lesson in lessons}
    return _Totals(lessons, students, earned, graded, lesson_max)


def _due(due, lesson: str) -> str:
    if due is None:
        return ""
    if isinstance(due, Mapping):
        due = due.get(lesson)
        return "" if due is None else str(due)
    return str(due)


def nbgrader_rows(rows: Iterable, due=None) -> list[dict[str, str]]:
    """The rows of `nbgrader export`'s CSV (keys NBGRADER_COLUMNS, values strings), one per student x lesson of
    the gradebook, sorted by student then lesson. due: None, one due date for every lesson, or a mapping
    lesson -> due date (str() of it is written, as nbgrader writes str(assignment.duedate)).
    A student with no rows for a lesson gets 0 out of that lesson's max, like a missing submission in nbgrader."""
    t = _totals(rows)
    out = []
    for student in t.students:
        for lesson in t.lessons:
            key = (student, lesson)
            submitted = key in t.earned
            points = t.earned[key] if submitted else 0.0
            max_score = t.graded[key] if submitted else t.lesson_max[lesson]
            out.append({
                "assignment": lesson,
                "duedate": _due(due, lesson),
                "timestamp": "",
                "student_id": student,
                "last_name": "",
                "first_name": "",
                "email": "",
                "raw_score": _num(points),
                "late_submission_penalty": _num(0.0),
                "score": _num(points),
                "max_score": _num(max_score),
            })
    return out


def lms_columns(rows: Iterable) -> list[str]:
    return ["student", *_totals(rows).lessons, "total", "max_total", "percent"]


def lms_rows(rows: Iterable) -> list[dict[str, str]]:
    """One row per student (sorted): student, the points earned in each lesson (sorted columns), total,
    max_total (the sum of the lessons' graded maxima, the same for every student) and percent (1 decimal;
    empty when nothing could be graded). A student with no rows for a lesson gets 0 for it."""
    t = _totals(rows)
    max_total = sum(t.lesson_max.values())
    out = []
    for student in t.students:
        points = {lesson: t.earned.get((student, lesson), 0.0) for lesson in t.lessons}
        total = sum(points.values())
        row = {"student": student}
        row.update({lesson: _num(p) for lesson, p in points.items()})
        row["total"] = _num(total)
        row["max_total"] = _num(max_total)
        row["percent"] = f"{100 * total / max_total:.1f}" if max_total > 0 else ""
        out.append(row)
    return out


def to_csv(columns: Iterable[str], rows: Iterable[Mapping[str, str]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def nbgrader_csv(rows: Iterable, due=None) -> str:
    return to_csv(NBGRADER_COLUMNS, nbgrader_rows(rows, due))


def lms_csv(rows: Iterable) -> str:
    rows = list(rows)
    return to_csv(lms_columns(rows), lms_rows(rows))


def write_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.export", description=__doc__.splitlines()[3])
    parser.add_argument("--gradebook", type=Path, default=Path("grades/gradebook.csv"))
    parser.add_argument("--nbgrader-csv", type=Path, default=Path("grades/nbgrader_export.csv"))
    parser.add_argument("--lms-csv", type=Path, default=Path("grades/totals.csv"))
    args = parser.parse_args(argv)
    try:
        entries = read_gradebook(args.gradebook)
    except GradebookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_atomic(args.nbgrader_csv, nbgrader_csv(entries))
    write_atomic(args.lms_csv, lms_csv(entries))
    print(f"wrote {args.nbgrader_csv} and {args.lms_csv} ({len({e.student for e in entries})} students, "
          f"{len({e.lesson for e in entries})} lessons)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
