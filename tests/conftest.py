import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")

# make test runs pytest-xdist workers, one per core: each gets its share of the cores, and so does every process
# it starts (a grading child, a notebook run, a gloo rank), or the workers' thread pools oversubscribe the machine.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ.update(MEMFIT_CPUS=_share, OMP_NUM_THREADS=_share)

# MEMFIT_TEST_GPUS=N on a machine of N GPUs spreads the pytest-xdist workers over them (worker k takes GPU k mod N),
# set before anything starts CUDA; unset, every worker shares the GPU that CUDA gives first.
if os.environ.get("MEMFIT_TEST_GPUS") and os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    _worker = int(os.environ["PYTEST_XDIST_WORKER"][2:])
    os.environ["CUDA_VISIBLE_DEVICES"] = str(_worker % int(os.environ["MEMFIT_TEST_GPUS"]))

import memfit  # noqa: E402,F401  (decides TRITON_INTERPRET before any test imports triton; keeps to MEMFIT_CPUS)
from autograder.checks import references  # noqa: E402

# The grader's reference values (predict_peak's measured steps, AdamW's loss curve) are computed once per worker,
# as grading a class computes them once, not again by every test that grades an entry of the same check.
references.keep_computed()


# The longest tests first, so that neither worker is left with one of them at the end while the other idles.
LONGEST_FIRST = ("test_notebooks.py", "test_grading_scale.py", "test_checks_kernel_fusion.py", "test_grading.py",
                 "test_slides.py")


# Two tiers. `make test` (a quarter of an hour on a 2-core machine) proves what every change can break: each
# reference passes every case of its check, every wrong entry (registered and blind) loses its points with its
# message, grading end to end, the seal, the layers, the lessons generated. `make test-all` (CI) adds the tier
# marked `full` here: the grading matrix's configurations, every right entry keeping its points (registered, blind,
# and over many draws), the notebooks top to bottom, a class graded at scale, every deck built and opened. Plain
# `pytest tests` runs both.
FULL_TIER = {  # test file: the tests of it (by name, and a substring of the node id where only some cases are)
    "test_grading_matrix.py": [("test_every_reference_earns_every_point_under_every_configuration", "")],
    "test_blind_mutants.py": [("test_blind_entry", "-right-")],
    "test_registry_entries.py": [("test_registry_entry", "/right/")],
    "test_draws.py": [("test_a_right_entry_keeps_its_points_on_every_draw", "")],
    "test_notebooks.py": [("test_solution_runs_top_to_bottom", "")],
    "test_grading_scale.py": [("", "")],
    "test_checks_fine_tune.py": [("test_each_plan_extrapolates_to_llama_8b_whole_depth", "")],
    # every deck built and opened in a browser (minutes: each deck's figures run the lesson's code)
    "test_slides.py": [("test_deck_renders_offline", ""), ("test_built_html_names_no_network", "")],
}


def in_full_tier(item) -> bool:
    return any(item.name.startswith(name) and part in item.nodeid
               for name, part in FULL_TIER.get(item.path.name, ()))


@pytest.hookimpl(tryfirst=True)  # before pytest's -m selection reads the markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        if in_full_tier(item):
            item.add_marker(pytest.mark.full)
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: the order within each part stays


# MEMFIT_TEST_LOG=FILE writes each test's outcome and time as it ends, with a failure's message: a run stopped at a
# time limit (a lent GPU machine's) still tells what failed and why, and how long each test took.
def pytest_runtest_logreport(report):
    path = os.environ.get("MEMFIT_TEST_LOG")
    if not path or hasattr(report, "node") or not (report.when == "call" or report.failed):
        return  # hasattr(report, "node"): an xdist worker's copy; the controller writes
    with open(path, "a") as log:
        log.write(f"{report.outcome} {report.duration:.1f}s {report.nodeid}\n")
        if report.failed:
            log.write(report.longreprtext[-3000:] + "\n\n")
