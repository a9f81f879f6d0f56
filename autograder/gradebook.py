"""grades/gradebook.csv: one row per (student, lesson, check), written atomically, merged with
what is already there so that grading one student or lesson loses nobody else's rows."""
from __future__ import annotations

import csv
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

COLUMNS = ("student", "lesson", "check", "points", "max_points", "status", "message", "fingerprint")
COLUMNS_V1 = COLUMNS[:-1]  # gradebooks written before fingerprints: read, then regraded
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
    fingerprint: str = ""  # the notebook's bytes and the grader's code (autograder.runner.fingerprint)


def read(path: Path) -> list[Row]:
    if not path.exists():
        return []
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) not in (COLUMNS, COLUMNS_V1):
                raise ValueError(f"columns {reader.fieldnames}")
            return [Row(r["student"], r["lesson"], r["check"], float(r["points"]), float(r["max_points"]),
                        r["status"], r["message"], r.get("fingerprint") or "") for r in reader]
    except (ValueError, KeyError, csv.Error) as exc:
        backup = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        path.rename(backup)
        print(f"warning: {path} could not be read ({exc}); kept it as {backup} and started a new gradebook")
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
