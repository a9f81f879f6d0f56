"""python -m autograder.export: grades/gradebook.csv as nbgrader's `nbgrader export` CSV and as an LMS totals
table, from small hand-made gradebooks to exact CSV text; skipped (GPU) checks count towards no total, a student
with no rows for a lesson gets 0 out of that lesson's max, and nbgrader's own CsvExportPlugin writes our header."""
import ast
import csv
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course import course_env
from autograder.export import NBGRADER_COLUMNS, lms_csv, main, nbgrader_csv, nbgrader_rows, read_gradebook

# Three students, in code-point order "Doe, Jane" < "Zoë" < "alice"; "Zoë" has no rows for 01_memory.
# 00_first_kernel's GPU check is skipped for everyone: the lesson is graded out of 2, 01_memory out of 4.
GRADEBOOK = """\
student,lesson,check,points,max_points,status,message,fingerprint
alice,01_memory,b,1.5,4,failed,"off by one, see the hint",f3
alice,00_first_kernel,a,2,2,passed,,f1
alice,00_first_kernel,gpu,0,2,skipped,skipped: needs a GPU,f2
"Doe, Jane",00_first_kernel,a,0,2,error,boom,f4
"Doe, Jane",00_first_kernel,gpu,0,2,skipped,skipped: needs a GPU,f5
"Doe, Jane",01_memory,b,4,4,passed,,f6
Zoë,00_first_kernel,a,0,2,timeout,took longer than 60 s,f7
Zoë,00_first_kernel,gpu,0,2,skipped,skipped: needs a GPU,f8
"""

NBGRADER_EXPECTED = """\
assignment,duedate,timestamp,student_id,last_name,first_name,email,raw_score,late_submission_penalty,score,max_score
00_first_kernel,,,"Doe, Jane",,,,0,0,0,2
01_memory,,,"Doe, Jane",,,,4,0,4,4
00_first_kernel,,,Zoë,,,,0,0,0,2
01_memory,,,Zoë,,,,0,0,0,4
00_first_kernel,,,alice,,,,2,0,2,2
01_memory,,,alice,,,,1.5,0,1.5,4
"""

LMS_EXPECTED = """\
student,00_first_kernel,01_memory,total,max_total,percent
"Doe, Jane",0,4,4,6,66.7
Zoë,0,0,0,6,0.0
alice,2,1.5,3.5,6,58.3
"""


def without_fingerprint(text):
    rows = list(csv.reader(text.splitlines()))
    out = []
    for row in rows:
        line = []
        for field in row[:-1]:
            line.append(f'"{field}"' if "," in field else field)
        out.append(",".join(line))
    return "\n".join(out) + "\n"


@pytest.fixture
def gradebook(tmp_path):
    path = tmp_path / "gradebook.csv"
    path.write_text(GRADEBOOK, encoding="utf-8")
    return path


@pytest.mark.parametrize("fingerprint", [True, False])
def test_exact_csv_text(tmp_path, fingerprint):
    path = tmp_path / "gradebook.csv"
    path.write_text(GRADEBOOK if fingerprint else without_fingerprint(GRADEBOOK), encoding="utf-8")
    rows = read_gradebook(path)
    assert nbgrader_csv(rows) == NBGRADER_EXPECTED
    assert lms_csv(rows) == LMS_EXPECTED


def test_partial_points_and_a_gpu_machine():
    """Points earned add up across checks; on a machine with a GPU the GPU check is graded and counted (here
    only for one student, graded elsewhere: the lesson's max is then the larger graded max)."""
    rows = [
        dict(student="s", lesson="00_x", check="a", points="0.5", max_points="2", status="failed"),
        dict(student="s", lesson="00_x", check="b", points="1.25", max_points="1", status="passed"),
        dict(student="t", lesson="00_x", check="a", points="2", max_points="2", status="passed"),
        dict(student="t", lesson="00_x", check="gpu", points="2", max_points="2", status="passed"),
        dict(student="u", lesson="01_y", check="c", points="1", max_points="3", status="passed"),
    ]
    assert nbgrader_csv(rows).splitlines()[1:] == [
        "00_x,,,s,,,,1.75,0,1.75,3",
        "01_y,,,s,,,,0,0,0,3",
        "00_x,,,t,,,,4,0,4,4",
        "01_y,,,t,,,,0,0,0,3",
        "00_x,,,u,,,,0,0,0,4",
        "01_y,,,u,,,,1,0,1,3",
    ]
    assert lms_csv(rows).splitlines() == [
        "student,00_x,01_y,total,max_total,percent",
        "s,1.75,0,1.75,7,25.0",
        "t,4,0,4,7,57.1",
        "u,0,1,1,7,14.3",
    ]


def test_due_dates(gradebook):
    rows = read_gradebook(gradebook)
    by_lesson = nbgrader_rows(rows, due={"01_memory": "2025-03-01 23:59:00"})
    assert [r["duedate"] for r in by_lesson] == ["", "2025-03-01 23:59:00"] * 3
    assert {r["duedate"] for r in nbgrader_rows(rows, due="2025-01-01 00:00:00")} == {"2025-01-01 00:00:00"}
    assert list(by_lesson[0]) == list(NBGRADER_COLUMNS)


def test_only_skipped_checks(tmp_path):
    rows = [dict(student="s", lesson="00_x", check="gpu", points="0", max_points="2", status="skipped")]
    assert nbgrader_csv(rows).splitlines()[1:] == ["00_x,,,s,,,,0,0,0,0"]
    assert lms_csv(rows).splitlines()[1:] == ["s,0,0,0,"]


def test_empty_gradebook(tmp_path):
    path = tmp_path / "gradebook.csv"
    path.write_text("student,lesson,check,points,max_points,status,message\n")
    assert nbgrader_csv(read_gradebook(path)) == ",".join(NBGRADER_COLUMNS) + "\n"
    assert lms_csv(read_gradebook(path)) == "student,total,max_total,percent\n"


def test_cli_writes_both_files_atomically(gradebook, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "nb.csv").write_text("old\n")
    assert main(["--gradebook", str(gradebook), "--nbgrader-csv", str(out / "nb.csv"),
                 "--lms-csv", str(out / "sub" / "totals.csv")]) == 0
    assert (out / "nb.csv").read_text(encoding="utf-8") == NBGRADER_EXPECTED
    assert (out / "sub" / "totals.csv").read_text(encoding="utf-8") == LMS_EXPECTED
    assert sorted(p.name for p in out.rglob("*")) == ["nb.csv", "sub", "totals.csv"]   # no temp files left
    assert "3 students, 2 lessons" in capsys.readouterr().out


def test_cli_missing_gradebook(tmp_path):
    """As a real `python -m autograder.export`: one line on stderr, status 2, nothing written."""
    result = subprocess.run([sys.executable, "-m", "autograder.export", "--gradebook", str(tmp_path / "none.csv"),
                             "--nbgrader-csv", str(tmp_path / "nb.csv"), "--lms-csv", str(tmp_path / "lms.csv")],
                            capture_output=True, text=True, env=course_env(), cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"error: {tmp_path / 'none.csv'}: no such gradebook\n"
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("text, why", [
    ("name,score\nalice,3\n", "not a gradebook"),
    ("", "not a gradebook"),
    ("student,lesson,check,points,max_points,status,message\nalice,00_x,a,two,2,passed,\n", "cannot be read"),
    ("student,lesson,check,points,max_points,status,message\nalice,00_x,a,2,2,passed\n", "wrong number of fields"),
    ("student,lesson,check,points,max_points,status,message\nalice,00_x,a,2,2,graded,\n", "unknown status"),
    (b"student,lesson,check,points,max_points,status,message\nZo\xeb,00_x,a,2,2,passed,\n", "cannot be read"),
])
def test_cli_unreadable_gradebook(tmp_path, capsys, text, why):
    path = tmp_path / "gradebook.csv"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    assert main(["--gradebook", str(path), "--nbgrader-csv", str(tmp_path / "nb.csv"),
                 "--lms-csv", str(tmp_path / "lms.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and why in err and err.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == ["gradebook.csv"]          # left as it was, nothing written


def test_cli_gradebook_is_a_folder(tmp_path, capsys):
    assert main(["--gradebook", str(tmp_path), "--nbgrader-csv", str(tmp_path / "nb.csv"),
                 "--lms-csv", str(tmp_path / "lms.csv")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path}: cannot be read")


def test_columns_match_nbgrader_source():
    """The `keys` list in CsvExportPlugin.export's source, read without running it."""
    export = pytest.importorskip("nbgrader.plugins.export")
    tree = ast.parse(inspect.getsource(export.CsvExportPlugin))
    keys = next(node.value for node in ast.walk(tree)
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "keys")
    assert tuple(ast.literal_eval(keys)) == NBGRADER_COLUMNS


def test_header_matches_nbgrader_export(tmp_path, monkeypatch):
    """nbgrader's CsvExportPlugin run against a throwaway nbgrader gradebook writes the same header, and for a
    student with no submission the same fields (nbgrader writes 0.0 where we write 0)."""
    pytest.importorskip("nbgrader")
    from nbgrader.api import Gradebook
    from nbgrader.plugins.export import CsvExportPlugin

    # nbgrader's Gradebook runs the `alembic` console script, installed next to this interpreter.
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    dest = tmp_path / "nbgrader.csv"
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        gb.add_assignment("00_x")
        gb.add_student("s")
        CsvExportPlugin(to=str(dest)).export(gb)
    theirs = list(csv.reader(dest.read_text().splitlines()))
    ours = list(csv.reader(nbgrader_csv(
        [dict(student="s", lesson="00_x", check="gpu", points="0", max_points="2", status="skipped")]).splitlines()))
    assert theirs[0] == ours[0] == list(NBGRADER_COLUMNS)
    assert [[f"{float(x):g}" if x.endswith(".0") else x for x in row] for row in theirs[1:]] == ours[1:]
