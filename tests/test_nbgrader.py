"""The course also runs as a plain nbgrader course: generate_assignment, autograde and
generate_feedback headless on sample submissions. (`nbgrader validate` exits 0 even when tests
fail, so scores are read from nbgrader's gradebook, never from an exit code.)"""
import shutil
import subprocess
from pathlib import Path

import pytest

from autograder.checks import checks_for

pytestmark = pytest.mark.xdist_group("nbgrader")  # its module fixtures are built once, on one worker

ROOT = Path(__file__).resolve().parent.parent
LESSON = "00_first_kernel"
pytest.importorskip("nbgrader", reason="skipped: nbgrader is not installed (make test installs it)")


def nbgrader(root: Path, *args: str) -> subprocess.CompletedProcess:
    from tools.make_lessons import nbgrader_command, nbgrader_env
    return subprocess.run(nbgrader_command() + [*args, "--log-level=WARN"], cwd=ROOT, env=nbgrader_env(root),
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("nbgrader")
    (root / "source" / LESSON).mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / f"{LESSON}.ipynb", root / "source" / LESSON)
    proc = nbgrader(root, "generate_assignment", LESSON, "--force")
    assert proc.returncode == 0, proc.stderr
    # Two students: one hands in the reference, one hands in the untouched release (stubs).
    for student, notebook in (("ada", ROOT / "solutions" / f"{LESSON}.ipynb"),
                              ("bob", root / "release" / LESSON / f"{LESSON}.ipynb")):
        folder = root / "submitted" / student / LESSON
        folder.mkdir(parents=True)
        shutil.copy(notebook, folder / f"{LESSON}.ipynb")
        (folder / "timestamp.txt").write_text("2026-11-21 12:00:00.000000 UTC")
    proc = nbgrader(root, "autograde", LESSON, "--force", "--ExecutePreprocessor.timeout=600")
    assert proc.returncode == 0, proc.stderr
    proc = nbgrader(root, "generate_feedback", LESSON, "--force")
    assert proc.returncode == 0, proc.stderr
    return root


def scores(root: Path) -> dict[str, dict[str, float]]:
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", "memfit") as gb:
        out = {}
        for student in ("ada", "bob"):
            nb = gb.find_submission_notebook(LESSON, LESSON, student)
            out[student] = {g.name: g.score for g in nb.grades}
        return out


def test_release_equals_our_lessons(course):
    from tools.make_lessons import dumps, normalize
    import json
    release = normalize(json.loads((course / "release" / LESSON / f"{LESSON}.ipynb").read_text()))
    assert dumps(release) == (ROOT / "lessons" / f"{LESSON}.ipynb").read_text()


def test_reference_scores_every_cpu_point_and_stub_scores_zero(course):
    s = scores(course)
    gpu = {c.name for c in checks_for(LESSON) if c.needs_gpu}
    points = {c.name: c.points for c in checks_for(LESSON)}
    for name, pts in points.items():
        if name in gpu:
            # On a machine without a GPU the GPU cell raises "skipped: needs a GPU": never a silent pass.
            import torch
            assert s["ada"][name] == (pts if torch.cuda.is_available() else 0)
        else:
            assert s["ada"][name] == pts, (name, s["ada"])
        assert s["bob"][name] == 0, (name, s["bob"])


def test_feedback_is_generated(course):
    for student in ("ada", "bob"):
        page = course / "feedback" / student / LESSON / f"{LESSON}.html"
        assert page.exists()
    assert "needs a GPU" in (course / "feedback" / "ada" / LESSON / f"{LESSON}.html").read_text()
