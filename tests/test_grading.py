"""make grade end to end: the reference gets every CPU point, stubs get 0 with "not implemented
yet", and broken submissions (a hanging cell, os._exit, an exception at import, a deleted cell,
invalid JSON, another lesson's notebook, an empty folder) grade without stopping the run, each
with a row for every check."""
import copy
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import gradebook
from course import course_env
from autograder.checks import checks_for

pytestmark = pytest.mark.xdist_group("grading")  # its module fixtures are built once, on one worker

ROOT = Path(__file__).resolve().parent.parent
LESSON = "00_first_kernel"
CHECKS = [c.name for c in checks_for(LESSON)]
CPU_POINTS = sum(c.points for c in checks_for(LESSON) if not c.needs_gpu)
# Time limits: 45 s for a check of the Triton interpreter on a busy machine; 10 s for bytes_of, a formula that takes
# milliseconds, where the hanging students hang (each hang costs its whole limit).
CHECK_LIMITS = "45,bytes_of=10"


def load(folder):
    return json.loads((ROOT / folder / f"{LESSON}.ipynb").read_text())


def cell_index(nb, grade_id):
    return next(i for i, c in enumerate(nb["cells"]) if (c["metadata"].get("nbgrader") or {}).get("grade_id") == grade_id)


def code_cell(source):
    return {"cell_type": "code", "metadata": {}, "source": source, "outputs": [], "execution_count": None}


def with_source(nb, grade_id, source):
    nb = copy.deepcopy(nb)
    nb["cells"][cell_index(nb, grade_id)]["source"] = source
    return nb


def run_grader(*args, timeout=900, **env):
    proc = subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=ROOT, env=course_env(**env),
                          capture_output=True, text=True, timeout=timeout)
    return proc


def rows_by(out, student):
    with open(out / "gradebook.csv", newline="") as f:
        return {r["check"]: r for r in csv.DictReader(f) if r["student"] == student}


UNWRITTEN_OUTPUT = """
import torch
torch.use_deterministic_algorithms(False)  # the grader turns the fill of fresh memory back on before each check
def scaled_add(x, y, alpha, out=None):
    if out is not None:  # right when given out= (the check's first case)
        return out.copy_(x + alpha * y)
    return torch.empty_like(x)  # a kernel that never ran: the output holds whatever the memory held
"""

WRONG_BEYOND_VISIBLE_SIZES = """

def scaled_add(x, y, alpha, out=None):  # right on every visible case (none has more than 3 blocks), 1% off beyond
    result = _right_scaled_add(x, y, alpha, out=out)
    if isinstance(x, torch.Tensor) and x.numel() > 3 * memfit.config("scaled_add")["BLOCK"]:
        result.mul_(1.01)
    return result
"""


CRASHES = """
def scaled_add(x, y, alpha, out=None):
    {}
"""


@pytest.fixture(scope="module")
def class_run(tmp_path_factory):
    subs = tmp_path_factory.mktemp("submissions")
    solution, stub = load("solutions"), load("lessons")
    bytes_src = "".join(stub["cells"][cell_index(stub, "bytes_of_solution")]["source"])
    notebooks = {
        "perfect": solution,
        "stub": stub,
        "hanging_cell": {**solution, "cells": solution["cells"] + [code_cell("import time\nwhile True:\n    time.sleep(0.05)\n")]},
        "hanging_function": with_source(solution, "bytes_of_solution", bytes_src.replace("raise NotImplementedError()", "while True:\n        pass")),
        "exit_in_cell": {**solution, "cells": solution["cells"] + [code_cell("import os\nos._exit(3)\n")]},
        "exit_in_function": with_source(solution, "scaled_add_solution",
                                        "import os\ndef scaled_add(x, y, alpha, out=None):\n    os._exit(7)\n"),
        "raises_at_import": {**solution, "cells": solution["cells"][:2] + [code_cell("import a_package_that_does_not_exist\n")] + solution["cells"][2:]},
        "deleted_cell": {**solution, "cells": [c for i, c in enumerate(solution["cells"]) if i != cell_index(solution, "scaled_add_solution")]},
        "wrong_lesson": {**solution, "metadata": {**solution["metadata"], "memfit": {"lesson": "01_memory"}}},
        "unwritten_output": with_source(solution, "scaled_add_solution", UNWRITTEN_OUTPUT),
        "wrong_beyond_visible_sizes": with_source(solution, "scaled_add_solution", "".join(
            solution["cells"][cell_index(solution, "scaled_add_solution")]["source"]).replace(
            "def scaled_add(", "def _right_scaled_add(") + WRONG_BEYOND_VISIBLE_SIZES),
        "segfault": with_source(solution, "scaled_add_solution", CRASHES.format("import ctypes; ctypes.string_at(0)")),
        "abort": with_source(solution, "scaled_add_solution", CRASHES.format("import os; os.abort()")),
    }
    for student, nb in notebooks.items():
        (subs / student).mkdir()
        (subs / student / f"{LESSON}.ipynb").write_text(json.dumps(nb))
    (subs / "invalid_json").mkdir()
    (subs / "invalid_json" / f"{LESSON}.ipynb").write_text('{"cells": [')
    (subs / "no_notebooks").mkdir()
    (subs / "no_notebooks" / "notes.txt").write_text("forgot to upload")
    out = tmp_path_factory.mktemp("grades")
    proc = run_grader("--submissions", subs, "--workers", 2, "--out", out,
                      MEMFIT_CHECK_TIMEOUT_S=CHECK_LIMITS, MEMFIT_CELL_TIMEOUT_S="5")
    return proc, out, subs


def test_run_completes_and_reports_what_it_could_not_grade(class_run):
    proc, out, _ = class_run
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no_notebooks: no notebooks in this submission" in proc.stderr
    assert "is not valid notebook JSON" in proc.stderr
    assert "holds lesson 01_memory" in proc.stderr


@pytest.mark.parametrize("student", ["perfect", "stub", "hanging_cell", "hanging_function", "exit_in_cell",
                                     "exit_in_function", "raises_at_import", "deleted_cell", "invalid_json", "wrong_lesson",
                                     "unwritten_output", "segfault", "abort"])
def test_every_student_has_a_row_for_every_check(class_run, student):
    _, out, _ = class_run
    assert sorted(rows_by(out, student)) == sorted(CHECKS)


def test_reference_earns_every_cpu_point(class_run):
    rows = rows_by(class_run[1], "perfect")
    assert sum(float(r["points"]) for r in rows.values() if r["check"] != "scaled_add_gpu") == CPU_POINTS
    import torch
    if torch.cuda.is_available():
        assert rows["scaled_add_gpu"]["status"] == "passed", rows["scaled_add_gpu"]["message"]
    else:
        assert rows["scaled_add_gpu"]["status"] == "skipped" and "needs a GPU" in rows["scaled_add_gpu"]["message"]


def test_stub_earns_nothing_and_is_told_why(class_run):
    rows = rows_by(class_run[1], "stub")
    assert all(float(r["points"]) == 0 for r in rows.values())
    assert all("not implemented yet" in r["message"] for name, r in rows.items() if name != "scaled_add_gpu")


@pytest.mark.parametrize("student", ["hanging_cell", "exit_in_cell", "raises_at_import"])
def test_a_broken_extra_cell_costs_nothing_else(class_run, student):
    rows = rows_by(class_run[1], student)
    assert {n: r["status"] for n, r in rows.items() if n != "scaled_add_gpu"} == {n: "passed" for n in CHECKS if n != "scaled_add_gpu"}


def test_hanging_function_times_out_alone(class_run):
    rows = rows_by(class_run[1], "hanging_function")
    assert rows["bytes_of"]["status"] == "timeout" and "did not finish within 10 s" in rows["bytes_of"]["message"]
    assert rows["scaled_add_numerics"]["status"] == "passed"


def test_time_limits_are_overridden_for_every_check_or_by_name():
    from autograder.checks import time_limit
    bytes_of, numerics = (next(c for c in checks_for(LESSON) if c.name == n) for n in ("bytes_of", "scaled_add_numerics"))
    assert time_limit(numerics) == numerics.timeout_s and time_limit(numerics, "") == numerics.timeout_s
    assert [time_limit(c, CHECK_LIMITS) for c in (bytes_of, numerics)] == [10, 45]
    assert [time_limit(c, "bytes_of=3") for c in (bytes_of, numerics)] == [3, numerics.timeout_s]


def test_exit_inside_a_function_is_an_error_of_its_checks(class_run):
    rows = rows_by(class_run[1], "exit_in_function")
    assert rows["scaled_add_numerics"]["status"] == "error" and "exit status 7" in rows["scaled_add_numerics"]["message"]
    assert rows["bytes_of"]["status"] == "passed"


def test_an_unwritten_output_is_named_the_same_way_every_time(class_run):
    """Fresh memory is NaN in the grading child (sandbox.fill_uninitialized_memory): garbage would put different
    numbers in the message from run to run, and hide from the learner that nothing was written."""
    message = rows_by(class_run[1], "unwritten_output")["scaled_add_numerics"]["message"]
    assert "never written" in message and "max |error|" not in message, message


def test_a_failure_says_whether_the_notebook_shows_it(class_run):
    """A failing check runs its visible cases again: the learner learns whether the check cell shows the failure."""
    visible = rows_by(class_run[1], "unwritten_output")["scaled_add_numerics"]
    hidden = rows_by(class_run[1], "wrong_beyond_visible_sizes")["scaled_add_numerics"]
    assert visible["status"] == hidden["status"] == "failed", (visible, hidden)
    assert visible["message"].endswith("fails too: it shows a visible case.)"), visible["message"]
    assert "(A hidden case: the notebook's visible cases pass" in hidden["message"], hidden["message"]


def test_native_crashes_are_worded_alike(class_run):
    """One memory corruption ends in SIGSEGV one run and SIGABRT the next: the row must not say which."""
    rows = {student: rows_by(class_run[1], student)["scaled_add_numerics"] for student in ("segfault", "abort")}
    assert {r["status"] for r in rows.values()} == {"error"}
    assert rows["segfault"]["message"] == rows["abort"]["message"], rows
    assert "crashed in native code" in rows["abort"]["message"]
    assert rows["segfault"]["points"] == "0"


def test_deleted_cell_is_named(class_run):
    rows = rows_by(class_run[1], "deleted_cell")
    assert rows["scaled_add_numerics"]["status"] == "error"
    assert "defines no function scaled_add" in rows["scaled_add_numerics"]["message"]
    assert rows["bytes_of"]["status"] == "passed"


@pytest.mark.parametrize("student, message", [("invalid_json", "not valid notebook JSON"), ("wrong_lesson", "holds lesson 01_memory")])
def test_unreadable_notebooks_get_error_rows(class_run, student, message):
    rows = rows_by(class_run[1], student)
    assert all(r["status"] == "error" and message in r["message"] and float(r["points"]) == 0 for r in rows.values())


def test_a_fresh_interpreter_grades_as_the_fork_server_does(class_run, tmp_path):
    """On a CPU machine children fork from a pre-imported server (autograder.forkserver); on a GPU machine each is
    a fresh `python -m autograder.child`. Both give the same rows: hangs, exits and crashes included."""
    students = ("perfect", "stub", "hanging_function", "exit_in_function", "raises_at_import")
    subs = tmp_path / "submissions"
    for student in students:
        (subs / student).mkdir(parents=True)
        (subs / student / f"{LESSON}.ipynb").write_bytes((class_run[2] / student / f"{LESSON}.ipynb").read_bytes())
    out = tmp_path / "grades"
    proc = run_grader("--submissions", subs, "--workers", 2, "--out", out, MEMFIT_FORK_SERVER="0",
                      MEMFIT_CHECK_TIMEOUT_S=CHECK_LIMITS, MEMFIT_CELL_TIMEOUT_S="5")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for student in students:
        fresh, forked = rows_by(out, student), rows_by(class_run[1], student)
        assert {k: (r["status"], r["message"]) for k, r in fresh.items()} == \
            {k: (r["status"], r["message"]) for k, r in forked.items()}, student


def test_the_hidden_seed_is_in_the_gradebook_and_a_regrade_draws_the_same_cases(class_run, tmp_path):
    """Drawn cases (autograder/checks/domain.py) come from one hidden seed per gradebook, written on every row: a
    regrade into that gradebook, or with --seed, reproduces every grade and message."""
    rows = gradebook.read(class_run[1] / "gradebook.csv")
    seeds = {r.seed for r in rows}
    assert len(seeds) == 1 and seeds.pop().isdigit(), "every row carries the class's one hidden seed"
    seed = int(rows[0].seed)
    subs = tmp_path / "submissions"
    students = ("perfect", "wrong_beyond_visible_sizes")
    for student in students:
        (subs / student).mkdir(parents=True)
        (subs / student / f"{LESSON}.ipynb").write_bytes((class_run[2] / student / f"{LESSON}.ipynb").read_bytes())
    out = tmp_path / "grades"
    for args in (("--seed", seed), ("--regrade",)):  # asked for, then read back from the gradebook
        proc = run_grader("--submissions", subs, "--workers", 2, "--out", out, *args,
                          MEMFIT_CHECK_TIMEOUT_S=CHECK_LIMITS, MEMFIT_CELL_TIMEOUT_S="5")
        assert proc.returncode == 0 and f"hidden seed {seed}" in proc.stderr, proc.stderr[-2000:]
        for student in students:
            again, first = rows_by(out, student), rows_by(class_run[1], student)
            assert {k: (r["status"], r["message"], r["seed"]) for k, r in again.items()} == \
                {k: (r["status"], r["message"], r["seed"]) for k, r in first.items()}, student


def test_feedback_pages_exist(class_run):
    page = class_run[1] / "feedback" / "perfect" / f"{LESSON}.html"
    assert page.exists() and "scaled_add_numerics" in page.read_text()


def test_missing_folder_is_a_one_line_error(tmp_path):
    proc = run_grader("--notebooks", tmp_path / "nope", "--out", tmp_path / "g")
    assert proc.returncode == 2 and "no such folder of notebooks" in proc.stderr


def test_one_lesson_is_graded_alone(tmp_path):
    """make grade LESSON=00: only that lesson's notebook of each student is graded; an unknown lesson is named."""
    for name in ("00_first_kernel.ipynb", "01_model_states.ipynb"):
        (tmp_path / "ann").mkdir(exist_ok=True)
        (tmp_path / "ann" / name).write_text((ROOT / "lessons" / name).read_text())
    proc = run_grader("--submissions", tmp_path, "--lessons", "0", "--workers", "1", "--out", tmp_path / "g")
    assert proc.returncode == 0, proc.stderr
    assert {r.lesson for r in gradebook.read(tmp_path / "g" / "gradebook.csv")} == {"00_first_kernel"}
    proc = run_grader("--submissions", tmp_path, "--lessons", "42", "--out", tmp_path / "g")
    assert proc.returncode == 2 and "no lesson '42'; the lessons are 00_first_kernel" in proc.stderr


def test_feedback_page_counts_points_as_the_terminal_does(tmp_path):
    """GPU-only checks skipped on a CPU count toward no total, in the HTML as in the terminal's summary."""
    from autograder.feedback import write_feedback
    rows = [gradebook.Row("ann", LESSON, "bytes_of", 2, 2, "passed", ""),
            gradebook.Row("ann", LESSON, "scaled_add_numerics", 0, 8, "failed", "wrong"),
            gradebook.Row("ann", LESSON, "scaled_add_gpu", 0, 2, "skipped", "skipped: needs a GPU")]
    page = write_feedback(tmp_path, "ann", LESSON, rows).read_text()
    assert "<b>2 / 10</b> points (2 more need a GPU: skipped on this machine, in no total here)" in page, page


def test_gradebook_keeps_other_students_rows(tmp_path):
    book = tmp_path / "gradebook.csv"
    row = lambda s, pts: gradebook.Row(s, LESSON, "bytes_of", pts, 2, "passed" if pts else "failed", "")
    gradebook.merge(book, [row("ann", 2), row("bob", 0)])
    gradebook.merge(book, [row("bob", 2)])
    assert {(r.student, r.points) for r in gradebook.read(book)} == {("ann", 2.0), ("bob", 2.0)}


def test_unreadable_gradebook_is_kept_aside(tmp_path):
    book = tmp_path / "gradebook.csv"
    book.write_text("this is not, the header\n1,2\n")
    assert gradebook.read(book) == []
    assert list(tmp_path.glob("gradebook.csv.unreadable-*"))


def test_a_ray_node_slow_to_start_is_started_again():
    """Ray waits a fixed 30 s for a local node to register (a loaded machine can take longer: make test failed so
    under two CPU-bound processes); the backend starts the cluster again instead of losing the run. Any other error
    is raised at once."""
    from autograder import ray_backend

    class FakeRay:
        def __init__(self, errors):
            self.errors, self.inits, self.shutdowns = list(errors), 0, 0

        def init(self, **_):
            self.inits += 1
            if self.errors:
                raise self.errors.pop(0)

        def shutdown(self):
            self.shutdowns += 1

    slow = Exception("The current node timed out during startup. This could happen because ...")
    ray = FakeRay([slow, slow])
    ray_backend.start_ray(ray)
    assert (ray.inits, ray.shutdowns) == (3, 2)
    ray = FakeRay([slow] * ray_backend.STARTUP_TRIES)
    with pytest.raises(Exception, match="timed out during startup"):
        ray_backend.start_ray(ray)
    assert ray.inits == ray_backend.STARTUP_TRIES
    ray = FakeRay([ValueError("bad address")])
    with pytest.raises(ValueError, match="bad address"):
        ray_backend.start_ray(ray)
    assert ray.inits == 1
