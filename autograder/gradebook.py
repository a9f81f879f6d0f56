"""grades/gradebook.csv: one row per (student, lesson, check), written atomically, merged with
what is already there so that grading one student or lesson loses nobody else's rows."""
from __future__ import annotations

import csv
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

COLUMNS = ("student", "lesson", "check", "points", "max_points", "status", "message", "fingerprint", "seed")
COLUMNS_V2 = COLUMNS[:-1]  # gradebooks written before hidden seeds: read, then regraded (their fingerprints differ)
COLUMNS_V1 = COLUMNS[:-2]  # gradebooks written before fingerprints: read, then regraded
STATUSES = ("passed", "failed", "error", "timeout", "skipped")


@dataclass
class Row:
    student: str
    lesson: str
    check: str
    points: float
    max_points: float
    status: str
    message: str
    fingerprint: str = ""  # the notebook's bytes, the grader's code and the seed (autograder.runner.fingerprint)
    seed: str = ""  # the hidden seed its drawn cases came from (autograder/checks/domain.py): a regrade reuses it


class GradebookError(Exception):
    """The gradebook is missing or cannot be read; str() names the file and the problem."""


def points(rows: list[Row]) -> tuple[float, float, float]:
    """(points got, points graded here, points skipped for want of a GPU): the summary and the HTML count alike."""
    return (sum(r.points for r in rows), sum(r.max_points for r in rows if r.status != "skipped"),
            sum(r.max_points for r in rows if r.status == "skipped"))


def hidden_seed(rows: list[Row]) -> int | None:
    """The hidden seed the gradebook's rows were graded with (a class shares one), or None when none has one."""
    seeds = [int(r.seed) for r in rows if r.seed.strip().lstrip("-").isdigit()]
    return seeds[0] if seeds else None


def read_strict(path: Path) -> list[Row]:
    """The rows (the columns in any order, with or without fingerprints), or GradebookError."""
    path = Path(path)
    if not path.exists():
        raise GradebookError(f"{path}: no such gradebook")
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            columns = tuple(reader.fieldnames or ())
            if sorted(columns) not in (sorted(COLUMNS), sorted(COLUMNS_V2), sorted(COLUMNS_V1)):
                raise GradebookError(f"{path}: not a gradebook (columns {', '.join(columns) or 'none'})")
            rows = []
            for r in reader:
                if None in r or any(r[c] is None for c in COLUMNS_V1):
                    raise GradebookError(f"{path}: line {reader.line_num} has the wrong number of fields")
                if r["status"] not in STATUSES:
                    raise GradebookError(f"{path}: line {reader.line_num} has the unknown status {r['status']!r}")
                rows.append(Row(r["student"], r["lesson"], r["check"], float(r["points"]), float(r["max_points"]),
                                r["status"], r["message"], r.get("fingerprint") or "", r.get("seed") or ""))
            return rows
    except GradebookError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, csv.Error) as exc:
        raise GradebookError(f"{path}: cannot be read ({exc})") from exc


def read(path: Path) -> list[Row]:
    """The rows, or none: a missing gradebook is a new one, and one that cannot be read is kept aside."""
    if not path.exists():
        return []
    try:
        return read_strict(path)
    except GradebookError as exc:
        backup = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        path.rename(backup)
        print(f"warning: {exc}; kept it as {backup} and started a new gradebook")
        return []


def write(path: Path, rows: list[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in sorted(rows, key=lambda r: (r.student, r.lesson)):
            writer.writerow(dict(asdict(row), points=f"{row.points:g}", max_points=f"{row.max_points:g}"))
    os.replace(tmp, path)


def merge(path: Path, new_rows: list[Row]) -> None:
    """Replace the rows of every (student, lesson) in new_rows; keep all others."""
    regraded = {(r.student, r.lesson) for r in new_rows}
    kept = [r for r in read(path) if (r.student, r.lesson) not in regraded]
    write(path, kept + new_rows)
