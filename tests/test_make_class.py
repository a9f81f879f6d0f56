"""tests/make_class.py: a synthetic class of valid notebooks, the same bytes for the same seed, a mixture of
reference, stub and mutant cells, and a manifest that says what the grader should give. Nothing is graded."""
import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course import course_env
from memfit.notebook import cell_source, lesson_of, read_notebook
from tests import make_class

pytestmark = pytest.mark.xdist_group("make_class")  # its module fixtures are built once, on one worker

ROOT = Path(__file__).resolve().parent.parent
STUDENTS = 10


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("class")
    assert make_class.main([str(out), "--students", str(STUDENTS), "--seed", "0"]) == 0
    return out, json.loads((out / "manifest.json").read_text())


def test_every_student_gets_every_lesson_as_valid_nbformat_4(generated):
    out, manifest = generated
    lessons = make_class.all_lessons()
    assert manifest["lessons"] == lessons and len(manifest["class"]) == STUDENTS
    for student in manifest["class"]:
        assert sorted(p.stem for p in (out / student).glob("*.ipynb")) == lessons
        for lesson in lessons:
            path = out / student / f"{lesson}.ipynb"
            nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
            nbformat.validate(nb)
            assert nb.nbformat == 4
            raw = read_notebook(path)  # the grader's own reader
            assert lesson_of(raw, path) == lesson


def test_the_same_seed_gives_the_same_bytes(generated, tmp_path):
    out, _ = generated
    again = tmp_path / "again"
    proc = subprocess.run([sys.executable, "-m", "tests.make_class", str(again), "--students", str(STUDENTS),
                           "--seed", "0"], cwd=ROOT, env=course_env(PYTHONHASHSEED="123"), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert files(again) == files(out)
    other = tmp_path / "other"
    make_class.make_class(other, STUDENTS, 1, make_class.all_lessons())
    assert files(other) != files(out)


def test_a_folder_with_another_class_is_refused(generated):
    out, _ = generated
    with pytest.raises(SystemExit):
        make_class.main([str(out), "--students", "2"])


def test_the_mixture_has_all_three_kinds_and_every_outcome(generated):
    _, manifest = generated
    cells = manifest["summary"]["cells"]
    assert all(cells[k] > 0 for k in ("reference", "stub", "mutant")), cells
    outcomes = manifest["summary"]["checks"]
    assert {make_class.KEEPS, make_class.LOSES, make_class.SKIPPED} <= set(outcomes), outcomes
    profiles = [r["profile"] for r in manifest["class"].values()]
    assert profiles.count("all reference") >= 1 and profiles.count("all stub") >= 1 and "mixed" in profiles
    for record in manifest["class"].values():
        for lesson in record["lessons"].values():
            kinds = {e["kind"] for e in lesson["exercises"].values()}
            if record["profile"] == "all reference":
                assert kinds == {"reference"}
                assert all(c["expected"] in (make_class.KEEPS, make_class.SKIPPED) for c in lesson["checks"].values())
            if record["profile"] == "all stub":
                assert "mutant" not in kinds
                assert all(c["expected"] in (make_class.LOSES, make_class.SKIPPED) for c in lesson["checks"].values())


def test_cells_keep_their_metadata_and_take_the_chosen_source(generated):
    out, manifest = generated
    for student, record in manifest["class"].items():
        for lesson, described in record["lessons"].items():
            release = json.loads((ROOT / "lessons" / f"{lesson}.ipynb").read_text())
            solution = json.loads((ROOT / "solutions" / f"{lesson}.ipynb").read_text())
            nb = json.loads((out / student / f"{lesson}.ipynb").read_text())
            assert nb["metadata"] == release["metadata"] and nb["metadata"]["memfit"]["lesson"] == lesson
            assert [c["metadata"] for c in nb["cells"]] == [c["metadata"] for c in release["cells"]]
            chosen = {e["cell"] - 1: e for e in described["exercises"].values()}
            for i, cell in enumerate(nb["cells"]):
                source = cell_source(cell)
                if i not in chosen:
                    assert source == cell_source(release["cells"][i])
                elif chosen[i]["kind"] == "reference":
                    assert source == cell_source(solution["cells"][i])
                elif chosen[i]["kind"] == "stub":
                    assert source == cell_source(release["cells"][i])
                else:
                    imports = [n for n in ast.parse(source).body if isinstance(n, ast.ImportFrom)
                               and n.module == chosen[i]["module"]]
                    assert {a.asname: a.name for n in imports for a in n.names} == chosen[i]["mutant"]
                    if chosen[i]["replacement"] == "whole cell":
                        assert len(imports) == len(ast.parse(source).body)


def test_mutant_imports_name_real_functions(generated):
    _, manifest = generated
    for record in manifest["class"].values():
        for described in record["lessons"].values():
            for ex in described["exercises"].values():
                if ex["kind"] == "mutant":
                    module = importlib.import_module(ex["module"])
                    assert all(callable(getattr(module, m, None)) for m in ex["mutant"].values())
                    assert ex["registered"], f"{ex['mutant']} is registered for no check"


def test_an_all_stub_student_holds_the_release(generated):
    out, manifest = generated
    student = next(s for s, r in manifest["class"].items() if r["profile"] == "all stub")
    for lesson in manifest["lessons"]:
        assert (out / student / f"{lesson}.ipynb").read_bytes() == (ROOT / "lessons" / f"{lesson}.ipynb").read_bytes()


def test_expected_outcomes_follow_the_registry():
    """A check's outcome from the choice of its functions: stub, wrong, right, an unproven mutant, a GPU check."""
    lesson = make_class.Lesson("00_first_kernel")
    cell = next(i for i, ex in lesson.exercises.items() if ex.names == ["scaled_add"])
    checks = {c.name: c for c in lesson.checks}

    def outcome(choice, check):
        return make_class.Notebook(lesson, {cell: choice}).expect(checks[check])[0]

    mutant = lambda name: make_class.Choice("mutant", {"scaled_add": name}, whole=True)  # noqa: E731
    assert outcome(make_class.Choice("reference"), "scaled_add_numerics") == make_class.KEEPS
    assert outcome(make_class.Choice("stub"), "scaled_add_memory") == make_class.LOSES
    assert outcome(mutant("scaled_add_in_pytorch"), "scaled_add_memory") == make_class.LOSES
    assert outcome(mutant("scaled_add_in_pytorch"), "scaled_add_numerics") == make_class.UNKNOWN
    assert outcome(mutant("scaled_add_block_64"), "scaled_add_numerics") == make_class.KEEPS
    assert outcome(mutant("scaled_add_block_64"), "scaled_add_gpu") == make_class.SKIPPED
