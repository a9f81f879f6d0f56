"""A grade means something, under every way of running the grader.

* Every lesson's reference notebook earns every point this machine can grade, under every configuration of the
  grader it offers: children forked from the fork server or started as fresh interpreters (as on a GPU machine),
  lesson 03's ranks forked from the rank server or started fresh, one worker or several, the local or the Ray
  backend. The configurations are chosen so that each option takes each of its values at least once; the grader's
  own state (a server it starts, a flag it sets) must never read as tampering in any of them.
* A notebook whose answers are the course's references, imported or wrapped, earns nothing in any lesson 01-08, and
  is told why: "lesson NN's reference is not available to graded code: write your own".
"""
import ast
import csv
import json

import pytest

from autograder.checks import checks_for
from course import ROOT
from course.lessons import lessons, reference_path, topic
from tests.test_grading import run_grader

pytestmark = pytest.mark.slow

LESSONS = lessons()
# Limits far above any check's and cell's time on a loaded 2-core machine: a verdict here must not follow its speed
PATIENT = dict(MEMFIT_CHECK_TIMEOUT_S="1200", MEMFIT_CELL_TIMEOUT_S="600")
REFUSED = "reference is not available to graded code: write your own"
CONFIGURATIONS = {  # each option on and off at least once
    "fork server, rank server, 2 workers": dict(args=("--workers", 2), env={}),
    "fresh interpreters, ranks fresh, 1 worker": dict(args=("--workers", 1),
                                                      env=dict(MEMFIT_FORK_SERVER="0", MEMFIT_RANK_SERVER="0")),
    "Ray backend, 2 workers": dict(args=("--workers", 2, "--backend", "ray"), env={}),
}


def read_book(out):
    with open(out / "gradebook.csv", newline="") as f:
        return list(csv.DictReader(f))


def solution_cells(nb):
    return [c for c in nb["cells"]
            if c["cell_type"] == "code" and (c["metadata"].get("nbgrader") or {}).get("solution")]


def defined_names(source: str) -> list[tuple[str, bool]]:
    """(name, is a class) of the functions and classes a cell defines at its top level."""
    tree = ast.parse(source)
    return [(n.name, isinstance(n, ast.ClassDef)) for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def imports_the_answers(lesson: str) -> str:
    return f"from memfit.from_lessons.{topic(lesson)} import {{names}}\n"


def wraps_the_answers(lesson: str) -> str:
    """Reaches the reference through the grader's own module, which holds it, and wraps or subclasses each answer."""
    return (f"import sys\n_checks = sys.modules['autograder.checks.{topic(lesson)}']\n"
            f"_ref = next(v for v in vars(_checks).values() if getattr(v, '__name__', '') == "
            f"'memfit.from_lessons.{topic(lesson)}')\n{{defs}}")


CALLS = """
def {name}(*args, **kwargs):
    import sys
    checks = sys.modules['autograder.checks.{topic}']
    ref = next(v for v in vars(checks).values() if getattr(v, '__name__', '') == 'memfit.from_lessons.{topic}')
    return getattr(ref, '{name}')(*args, **kwargs)
"""
HOW = ("imports", "wraps", "calls")


def cheating(lesson: str, how: str) -> dict:
    """The lesson's solution, with each answer cell's functions and classes taken from the reference instead."""
    nb = json.loads((ROOT / "solutions" / f"{lesson}.ipynb").read_text())
    stub = {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"])
            for c in solution_cells(json.loads((ROOT / "lessons" / f"{lesson}.ipynb").read_text()))}
    saved = {name for name, _ in defined_names(reference_path(lesson).read_text())}
    for cell in solution_cells(nb):
        names = [(n, is_class) for n, is_class in defined_names("".join(cell["source"])) if n in saved]
        if not names:
            cell["source"] = stub[cell["metadata"]["nbgrader"]["grade_id"]]
            continue
        unsaved = len(names) < len(defined_names("".join(cell["source"])))  # answers no reference holds: the stub's
        before = stub[cell["metadata"]["nbgrader"]["grade_id"]] + "\n" if unsaved else ""
        if how == "imports":
            cell["source"] = imports_the_answers(lesson).format(names=", ".join(n for n, _ in names))
        elif how == "calls":  # nothing to see before the call: the reference is looked up when the function runs
            cell["source"] = "".join(
                f"class {n}(_ref.{n}):\n    pass\n" if is_class else CALLS.format(name=n, topic=topic(lesson))
                for n, is_class in names)
            if any(is_class for _, is_class in names):
                cell["source"] = wraps_the_answers(lesson).format(defs=cell["source"])
        else:
            defs = "".join(f"class {n}(_ref.{n}):\n    pass\n" if is_class else
                           f"def {n}(*args, **kwargs):\n    return _ref.{n}(*args, **kwargs)\n" for n, is_class in names)
            cell["source"] = wraps_the_answers(lesson).format(defs=defs)
        cell["source"] = before + cell["source"]
    return nb


def cpu_points(lesson):
    return sum(c.points for c in checks_for(lesson) if not c.needs_gpu)


@pytest.fixture(scope="module")
def submissions(tmp_path_factory):
    subs = tmp_path_factory.mktemp("matrix")
    for lesson in LESSONS:
        (subs / "reference").mkdir(exist_ok=True)
        (subs / "reference" / f"{lesson}.ipynb").write_text((ROOT / "solutions" / f"{lesson}.ipynb").read_text())
    return subs


@pytest.fixture(scope="module")
def cheaters(tmp_path_factory):
    subs = tmp_path_factory.mktemp("cheaters")
    for lesson in LESSONS[1:]:  # lesson 00's answers are in no reference module: nothing to import
        for how in HOW:
            (subs / how).mkdir(exist_ok=True)
            (subs / how / f"{lesson}.ipynb").write_text(json.dumps(cheating(lesson, how)))
    return subs


@pytest.mark.parametrize("configuration", [pytest.param(c, marks=pytest.mark.xdist_group(f"matrix_{i}"))
                                           for i, c in enumerate(CONFIGURATIONS)])  # spread over the workers
def test_every_reference_earns_every_point_under_every_configuration(configuration, submissions, tmp_path):
    if "Ray" in configuration:
        pytest.importorskip("ray", reason="Ray is an optional extra (requirements-ray.txt; make test installs it)")
    how = CONFIGURATIONS[configuration]
    proc = run_grader("--submissions", submissions, "--out", tmp_path, *how["args"], timeout=3000,
                      **{**PATIENT, **how["env"]})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_book(tmp_path)
    lost = [f"{r['lesson']}:{r['check']} {r['status']}: {r['message'][:300]}" for r in rows
            if r["status"] != "passed" and not (r["status"] == "skipped" and "needs a GPU" in r["message"])]
    assert not lost, "\n".join(lost)
    for lesson in LESSONS:
        assert sum(float(r["points"]) for r in rows if r["lesson"] == lesson) == cpu_points(lesson), lesson


@pytest.fixture(scope="module")
def cheaters_graded(cheaters, tmp_path_factory):
    out = tmp_path_factory.mktemp("cheaters_graded")
    proc = run_grader("--submissions", cheaters, "--out", out, "--workers", 2, timeout=3000, **PATIENT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_book(out)


@pytest.mark.xdist_group("matrix_cheaters")
@pytest.mark.parametrize("lesson", LESSONS[1:])
def test_the_answers_imported_or_wrapped_earn_nothing(lesson, cheaters_graded):
    for how in HOW:
        mine = [r for r in cheaters_graded if r["student"] == how and r["lesson"] == lesson]
        assert {r["check"] for r in mine} == {c.name for c in checks_for(lesson)}, how
        earned = [f"{r['check']} {r['points']}" for r in mine if float(r["points"]) > 0]
        assert not earned, f"{how}: points for the course's own answers: {earned}"
        untold = [f"{r['check']}: {r['message'][:200]}" for r in mine
                  if r["status"] != "skipped" and REFUSED not in r["message"]
                  and "not implemented yet" not in r["message"]]  # an answer no reference holds: the stub's cell
        assert not untold, f"{how}: not told why:\n" + "\n".join(untold)


def test_the_cheating_notebooks_really_hold_the_answers(tmp_path):
    """Outside the grader (no seal), the wrapped answers are the reference's and pass: the test above measures the
    seal, not a broken notebook."""
    from memfit.notebook import load_notebook
    lesson = "01_model_states"
    path = tmp_path / f"{lesson}.ipynb"
    path.write_text(json.dumps(cheating(lesson, "wraps")))
    import autograder.checks.model_states  # noqa: F401  (the module the cheat reaches through)
    loaded = load_notebook(path, cell_timeout_s=None)
    assert not loaded.errors, loaded.errors
    for check in checks_for(lesson):
        check.run(*[getattr(loaded.module, n) for n in check.uses], cases="visible")


def test_an_earlier_lessons_reference_stays_usable():
    """Lesson 02 builds on lesson 01's count_params, imported from the course library: the seal of lesson 02 leaves
    it importable."""
    from course.lessons import this_and_later
    assert this_and_later("02_activations") == LESSONS[LESSONS.index("02_activations"):]
    assert "01_model_states" not in this_and_later("02_activations")
