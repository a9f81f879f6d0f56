"""The one-source pipeline holds: solutions are valid and consistent with the grader, lessons/
is generated from them (not stale, no outputs, no solutions)."""
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="skipped: nbformat is not installed (make test installs it)")

from course import course_env
from course.lessons import lessons, solution_path
from memfit.notebook import lesson_of, read_notebook

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = [solution_path(lesson) for lesson in lessons()]
LESSONS = [ROOT / "lessons" / f"{lesson}.ipynb" for lesson in lessons()]  # make lessons' releases


def nbgrader_meta(cell):
    return (cell.get("metadata") or {}).get("nbgrader") or {}


def test_there_are_lessons():
    assert SOLUTIONS, "no solution notebooks"


def test_every_notebook_of_solutions_and_lessons_is_a_lesson():
    """solutions/ holds the lessons (NN_topic.ipynb, what course.lessons finds) and nothing else, lessons/ one release
    of each: a notebook named otherwise would be skipped by everything that goes through course.lessons."""
    for folder in ("solutions", "lessons"):
        found = sorted(p.stem for p in (ROOT / folder).glob("*.ipynb"))
        assert found == lessons(), f"{folder}/ holds {found}; the lessons are {lessons()} (solutions/NN_topic.ipynb)"


@pytest.mark.parametrize("path", SOLUTIONS + LESSONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_is_valid_and_has_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    carrying = [i for i, c in enumerate(nb.cells, 1) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not carrying, f"{path.name}: cells {carrying} carry outputs; strip them before committing"
    assert lesson_of(read_notebook(path), path) == path.stem


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_grade_ids_unique_and_matching_the_grader(path):
    from tools.make_lessons import graded_cells_disagreeing
    nb = read_notebook(path)
    ids = [nbgrader_meta(c)["grade_id"] for c in nb["cells"] if nbgrader_meta(c).get("grade_id")]
    assert len(ids) == len(set(ids)), f"duplicate grade ids: {sorted({i for i in ids if ids.count(i) > 1})}"
    assert not graded_cells_disagreeing(path.stem)
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if nbgrader_meta(cell).get("solution"):
            assert "### BEGIN SOLUTION" in src and "### END SOLUTION" in src, nbgrader_meta(cell)["grade_id"]
        elif "BEGIN SOLUTION" in src:
            pytest.fail(f"a solution region outside a solution cell: {src[:80]!r}")


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lessons_hold_stubs_not_solutions(path):
    text = path.read_text()
    assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text
    assert "raise NotImplementedError()" in text


def test_lessons_are_generated_from_solutions():
    pytest.importorskip("nbgrader", reason="skipped: nbgrader is not installed (make test installs it)")
    proc = subprocess.run([sys.executable, "-m", "tools.make_lessons", "--check"], cwd=ROOT, env=course_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_saved_library_code_is_the_reference_without_markers():
    """Every lesson that marks cells #@save has its module in memfit/from_lessons/, current and without markers, and
    every module there is one such lesson's."""
    from tools.make_lessons import LIBRARY, library_path, saved_code
    saving = [lesson for lesson in lessons() if saved_code(lesson) is not None]
    assert saving, "no lesson marks a cell #@save"
    for lesson in saving:
        code = saved_code(lesson)
        assert code and "BEGIN SOLUTION" not in code and "#@save" not in code.splitlines()
        assert library_path(lesson).read_text() == code, f"{library_path(lesson)} is stale: run `make lessons`"
    modules = sorted(p.name for p in LIBRARY.glob("*.py") if p.name != "__init__.py")
    assert modules == sorted(library_path(lesson).name for lesson in saving), \
        f"memfit/from_lessons/ holds {modules}; the lessons that save code are {saving}"


@pytest.mark.parametrize("lesson", lessons())
def test_solution_runs_top_to_bottom(lesson):
    """Every cell, demos included, runs without Jupyter, as the learner's notebook holds them: the hidden tests
    left out (test_checks_*'s test_reference_passes_every_case runs every case). Its time is reported, not
    asserted: benchmarks.notebook_times measures it in a Jupyter kernel (benchmarks/results/)."""
    proc = subprocess.run([sys.executable, "-m", "tools.run_notebook", "--visible-only",
                           str(solution_path(lesson).relative_to(ROOT))], cwd=ROOT,
                          env=course_env(MPLBACKEND="Agg"), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stderr.strip().splitlines()[-1])


def test_the_readme_has_one_row_per_lesson_in_order():
    """The README's lesson table follows solutions/: a row per lesson, numbered, opening the learner's release
    (lessons/, locally and in Colab: never the reference answers one click away), with the lesson's points as its
    CHECKS give them. A lesson added without its row, or a row left after a lesson went, fails here."""
    import re
    from autograder.checks import checks_for
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| (\d\d) \| \[[^\]]+\]\[l(\d\d)\] \(\[Colab\]\[c(\d\d)\]\) \|[^|]+\| (\d+) \|", readme, flags=re.M)
    assert [row[:3] for row in rows] == [(name[:2],) * 3 for name in lessons()], \
        f"README's lesson table numbers {[row[0] for row in rows]} should be one per solutions/ notebook: {lessons()}"
    links = dict(re.findall(r"^\[([lc]\d\d)\]: (\S+)$", readme, flags=re.M))
    for name in lessons():
        assert links.get(f"l{name[:2]}") == f"lessons/{name}.ipynb", f"README's link l{name[:2]} should open lessons/{name}.ipynb"
        assert (links.get(f"c{name[:2]}") or "").endswith(f"/blob/main/lessons/{name}.ipynb"), \
            f"README's Colab link c{name[:2]} should open lessons/{name}.ipynb"
    points = {number: int(total) for number, _, _, total in rows}
    for name in lessons():
        total = sum(check.points for check in checks_for(name))
        assert points[name[:2]] == total, f"README gives lesson {name} {points[name[:2]]} points; its CHECKS give {total}"
    assert "solutions/" not in readme.split("## For instructors")[0], \
        "the README's learner part links the reference answers (solutions/): link lessons/"


def test_readme_lines_fit_a_screen():
    """No README line over 200 characters (long lines hide what a learner reads first)."""
    long = [(n, len(line)) for n, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1) if len(line) > 200]
    assert not long, f"README lines over 200 characters (line, length): {long}"