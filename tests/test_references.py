"""autograder.checks.references: values a class shares, computed once and loaded by every child."""
import pickle
import subprocess
import sys

import pytest

from course import ROOT, course_env
from course.lessons import lessons
from autograder.checks import CheckFailed, checks_for, references
from autograder.checks.activations import DRAWN_PEAK_CASES, PEAK_CASES, check_predict_peak
from memfit.from_lessons import activations as reference_code
from tests.mutants import activations as mutants

pytestmark = pytest.mark.xdist_group("references")  # its module fixtures are built once, on one worker


# the measurements recorded: one per visible or hidden case, and one per case drawn with the class's hidden seed
CASES = len({case for kind in ("visible", "hidden") for case in PEAK_CASES[kind]}) + DRAWN_PEAK_CASES


@pytest.fixture
def fresh_values():
    """No values, and none kept when computed (as in a notebook or a grading child; the test workers keep them)."""
    saved = dict(references._VALUES)
    references._VALUES.clear()
    kept = references.keep_computed(False)
    yield references._VALUES
    references.keep_computed(kept)
    references._VALUES.clear()
    references._VALUES.update(saved)


@pytest.fixture(scope="module")
def recorded_02(tmp_path_factory):
    path = tmp_path_factory.mktemp("refs") / "02_activations.pkl"
    done = subprocess.run([sys.executable, "-m", "autograder.checks.references", "02_activations", str(path)],
                          cwd=ROOT, env=course_env(MEMFIT_THREADS="1", OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return path


def test_only_lessons_that_ask_for_references_compute_them():
    asking = {lesson: [c.name for c in checks_for(lesson) if c.references] for lesson in lessons()}
    assert references.lessons_with_references(lessons()) == [lesson for lesson in lessons() if asking[lesson]]
    assert {lesson: names for lesson, names in asking.items() if names} == {
        "02_activations": ["predict_peak"], "07_quantization": ["adamw8bit_convergence"]}


def test_recording_keeps_every_measured_peak_of_the_check(recorded_02):
    with open(recorded_02, "rb") as f:
        values = pickle.load(f)
    assert len(values) == CASES and all(k.startswith("predict_peak ") for k in values)
    assert all(v.peak > 0 for v in values.values())


def test_loaded_values_grade_like_values_computed_in_place(recorded_02, fresh_values):
    check_predict_peak(reference_code.predict_peak, cases="visible")  # computed in place: passes
    assert not fresh_values  # not recording: nothing kept
    assert references.load(recorded_02) == CASES
    check_predict_peak(reference_code.predict_peak, cases="all")  # loaded: the reference still passes
    with pytest.raises(CheckFailed, match="predicted peak"):
        check_predict_peak(mutants.peak_without_logit_gradients, cases="all")  # and a wrong prediction still fails


def test_a_loaded_value_is_the_measurement_itself(recorded_02, fresh_values):
    from memfit.training import Trainer, measure_step
    from autograder.checks.activations import CPU_CONFIGS
    references.load(recorded_02)
    cfg = CPU_CONFIGS["tiny"]
    key = f"predict_peak {cfg!r} 4 128 fp32 adamw none"
    assert key in fresh_values
    assert fresh_values[key] == measure_step(Trainer(cfg, "fp32", "adamw", "none", device="cpu"), 4, 128)


def test_a_check_gets_a_copy(fresh_values):
    fresh_values["k"] = [1.0, 2.0]
    got = references.reference("k", lambda: pytest.fail("a loaded value is not computed again"))
    got.append(3.0)
    assert references.reference("k", list) == [1.0, 2.0]


def test_a_file_that_is_not_reference_values_is_refused(tmp_path, fresh_values):
    path = tmp_path / "bad.pkl"
    path.write_bytes(pickle.dumps(["not", "a", "dict"]))
    with pytest.raises(ValueError, match="not a file of reference values"):
        references.load(path)
    assert not fresh_values
