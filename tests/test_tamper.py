"""Notebooks that try to game the grader gain no points (autograder/sandbox.py says what is guarded).

Every attack is a lesson-00 notebook graded by the real grader in one class run. Where an attack needs a
wrong answer to profit, it carries one (scaled_add returning garbage), so a grader that let the attack through
would award the points; the frame attack is also shown to pass the check when the guard is absent."""
import copy
import json
import os
import socket
import threading

import pytest

from autograder import sandbox
from autograder.checks import first_kernel as checks
from course import ROOT
from tests.test_grading import LESSON, cell_index, code_cell, load, rows_by, run_grader, with_source

pytestmark = pytest.mark.xdist_group("tamper")  # its module fixtures are built once, on one worker

WRONG_SCALED_ADD = """
import torch
def scaled_add(x, y, alpha, out=None):
    result = x * 0  # wrong: a learner who hopes the attack below hides it
    if out is not None:
        out.copy_(result)
        return out
    return result
"""

FRAME_THIEF = """
import sys, inspect, gc, torch
def _steal(x, frames):
    for f in frames:
        for name in ("torch_same", "exact", "expected", "want"):
            v = f.f_locals.get(name)
            if isinstance(v, torch.Tensor) and v.shape == x.shape:
                return v.to(x.dtype)
    return None

def scaled_add(x, y, alpha, out=None):
    tensors = (x, y) if out is None else (x, y, out)  # refuses bad calls as the exercise asks: only the theft is wrong
    if len({(t.shape, t.dtype, t.device) for t in tensors}) > 1 or not all(t.is_contiguous() for t in tensors):
        raise ValueError("x, y and out must match and be contiguous")
    result = _steal(x, WALK())
    if result is None:
        result = x * 0
    if out is not None:
        out.copy_(result)
        return out
    return result.clone()
"""

WALKS = {
    "frames_getframe": "lambda: _walk(sys._getframe(1))",
    "frames_inspect": "lambda: [fi.frame for fi in inspect.stack()]",
    "frames_traceback": "lambda: _walk(_tb_frame())",
}
WALK_HELPERS = """
def _walk(f):
    out = []
    while f is not None:
        out.append(f)
        f = f.f_back
    return out

def _tb_frame():
    try:
        raise RuntimeError
    except RuntimeError as e:
        return e.__traceback__.tb_frame
"""

GC_THIEF = """
import gc, torch
def scaled_add(x, y, alpha, out=None):
    tensors = (x, y) if out is None else (x, y, out)  # refuses bad calls as the exercise asks: only the theft is wrong
    if len({(t.shape, t.dtype, t.device) for t in tensors}) > 1 or not all(t.is_contiguous() for t in tensors):
        raise ValueError("x, y and out must match and be contiguous")
    candidates = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.dtype == torch.float64
                  and o.shape == x.shape]
    result = candidates[-1].to(x.dtype) if candidates else x * 0
    if out is not None:
        out.copy_(result)
        return out
    return result.clone()
"""

READS_HIDDEN_CHECKS = """
import math, pathlib, torch
import autograder
def bytes_of(shape, dtype):
    hidden = (pathlib.Path(autograder.__file__).parent / "checks" / "first_kernel.py").read_text()
    assert "BYTES_CASES" in hidden  # a learner who can read the hidden cases could hard-code their answers
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()
"""

READS_SOLUTION = """
import json, pathlib
import autograder
_nb = json.loads((pathlib.Path(autograder.__file__).parent.parent / "solutions" / "00_first_kernel.ipynb").read_text())
for _cell in _nb["cells"]:
    if (_cell["metadata"].get("nbgrader") or {}).get("grade_id") == "bytes_of_solution":
        exec("".join(_cell["source"]))
"""

PATCHES_AT_LOAD = {
    "redefines_allclose": "import torch, torch.testing\ntorch.allclose = lambda *a, **k: True\n"
                          "torch.testing.assert_close = lambda *a, **k: None\n",
    "patches_grader_function": "import autograder.checks.numerics as n, autograder.checks.first_kernel as c\n"
                               "n.assert_close_by_rule = lambda *a, **k: None\nc.assert_close_by_rule = n.assert_close_by_rule\n",
    "patches_grader_code": "import autograder.checks.first_kernel as c\n"
                           "c._check_one.__code__ = (lambda scaled_add, n, dtype, device, seed: None).__code__\n",
    "patches_grader_data": "import autograder.checks.first_kernel as c\nc.BYTES_CASES['hidden'].clear()\n",
    "replaces_with_a_builtin": "import torch.testing\ntorch.testing.assert_close = print\n",
    "shadows_a_tensor_method": "import torch\ntorch.Tensor.equal = lambda self, other: True\n",
    # PyTorch's own reset, taken from under the meter's guard: library code, but the grader's patch is gone
    "unwraps_the_meter_guard": "import torch\nfor _n in ('reset_peak_memory_stats', 'reset_max_memory_allocated'):\n"
                               "    setattr(torch.cuda, _n, getattr(getattr(torch.cuda, _n), '__wrapped__', print))\n",
}

PATCHES_DURING_CALL = """
import torch
def scaled_add(x, y, alpha, out=None):
    import autograder.checks.first_kernel as c
    c.assert_close_by_rule = lambda *a, **k: None  # patched inside the graded call, not at load time
    result = x * 0
    if out is not None:
        out.copy_(result)
        return out
    return result
"""

RESETS_PEAK = """
import torch
_reset = torch.cuda.reset_peak_memory_stats  # saved before the grader's meter swaps it out
_solution_scaled_add = scaled_add
def scaled_add(x, y, alpha, out=None):
    waste = torch.empty(8 * x.numel(), dtype=x.dtype, device=x.device)  # far past the budget...
    try:
        _reset()  # ...then hide it from the CUDA allocator's peak
    except Exception as exc:  # without a GPU the reset itself fails; only the meter's refusal matters here
        if "reset the peak-memory statistics" in str(exc):
            raise
    del waste
    return _solution_scaled_add(x, y, alpha, out=out)
"""

FORGES_RESULTS = """
import json, os
_line = json.dumps({"body": json.dumps({"event": "result", "check": "bytes_of", "status": "passed",
                                        "message": "passed"}, sort_keys=True), "mac": "0" * 64}) + "\\n"
for _fd in range(3, 40):
    try:
        os.write(_fd, _line.encode())
    except OSError:
        pass
os._exit(0)
"""

WRITES_THE_COURSE = """
import math, pathlib, subprocess, sys, torch
import autograder
def bytes_of(shape, dtype):  # a process the notebook starts carries no in-process guard: only the OS stops it
    subprocess.run([sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write('x')", str(pathlib.Path(
        autograder.__file__).parent.parent / "PROBE_NAME")], check=False)
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()
"""

NETWORK = """
import math, socket, torch
def bytes_of(shape, dtype):
    with socket.create_connection((HOST, PORT), timeout=5) as s:  # the answer only from outside the machine
        s.sendall(b"x")
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()
"""


def _replace(nb, grade_id, source):
    return with_source(nb, grade_id, source)


def _append(nb, source):
    return {**nb, "cells": nb["cells"] + [code_cell(source)]}


def _external_address():
    """A non-loopback address of this machine, or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


@pytest.fixture(scope="module")
def attacks(tmp_path_factory):
    solution, stub = load("solutions"), load("lessons")
    wrong = _replace(solution, "scaled_add_solution", WRONG_SCALED_ADD)
    notebooks = {name: _append(wrong, patch) for name, patch in PATCHES_AT_LOAD.items()}
    notebooks["patches_during_call"] = _replace(solution, "scaled_add_solution", PATCHES_DURING_CALL)
    for name, walk in WALKS.items():
        notebooks[name] = _replace(solution, "scaled_add_solution", WALK_HELPERS + FRAME_THIEF.replace("WALK()", f"({walk})()"))
    notebooks["frames_gc"] = _replace(solution, "scaled_add_solution", GC_THIEF)
    notebooks["resets_peak"] = _append(solution, RESETS_PEAK)
    notebooks["reads_hidden_checks"] = _replace(solution, "bytes_of_solution", READS_HIDDEN_CHECKS)
    notebooks["reads_solution"] = _append(stub, READS_SOLUTION)
    # the visible test cells edited: the correct code put in a test cell (as is, and relabelled a solution cell)
    right = "".join(solution["cells"][cell_index(solution, "bytes_of_solution")]["source"])
    edited = _replace(stub, "bytes_of", right)
    notebooks["edits_test_cell"] = edited
    relabelled = copy.deepcopy(edited)
    relabelled["cells"][cell_index(relabelled, "bytes_of")]["metadata"]["nbgrader"].update(grade=False, solution=True)
    notebooks["relabels_test_cell"] = relabelled
    notebooks["forges_results"] = _append(stub, FORGES_RESULTS)
    probe = ROOT / f".tamper-probe-{os.getpid()}"
    notebooks["writes_the_course"] = _replace(solution, "bytes_of_solution",
                                              WRITES_THE_COURSE.replace("PROBE_NAME", probe.name))

    server, address = None, _external_address()
    if address:
        server = socket.create_server((address, 0))
        threading.Thread(target=lambda: [server.accept() for _ in range(50)], daemon=True).start()
        notebooks["network"] = _replace(solution, "bytes_of_solution",
                                        NETWORK.replace("HOST", repr(address)).replace("PORT", str(server.getsockname()[1])))
    subs = tmp_path_factory.mktemp("attacks")
    for student, nb in notebooks.items():
        (subs / student).mkdir()
        (subs / student / f"{LESSON}.ipynb").write_text(json.dumps(nb))
    out = tmp_path_factory.mktemp("grades")
    proc = run_grader("--submissions", subs, "--workers", 2, "--out", out, MEMFIT_CHECK_TIMEOUT_S="60",
                      MEMFIT_CELL_TIMEOUT_S="20")
    if server:
        server.close()
    written = probe.exists()
    probe.unlink(missing_ok=True)
    return proc, out, set(notebooks), written


def _points(out, student):
    return {name: float(r["points"]) for name, r in rows_by(out, student).items()}


@pytest.mark.parametrize("student", sorted(PATCHES_AT_LOAD))
def test_patching_torch_or_the_grader_at_load_scores_nothing(attacks, student):
    rows = rows_by(attacks[1], student)
    assert all(float(r["points"]) == 0 for r in rows.values()), rows
    assert "changed what the grader relies on" in rows["scaled_add_numerics"]["message"]


def test_patching_the_grader_inside_the_graded_call_scores_nothing(attacks):
    rows = rows_by(attacks[1], "patches_during_call")
    assert rows["scaled_add_numerics"]["points"] == "0"
    assert "changed what the grader relies on (autograder.checks.first_kernel.assert_close_by_rule" in \
        rows["scaled_add_numerics"]["message"]
    assert rows["bytes_of"]["status"] == "passed"  # graded before the patch, with the grader intact


@pytest.mark.parametrize("student", [*WALKS, "frames_gc"])
def test_fetching_the_expected_output_from_the_grader_is_blocked(attacks, student):
    row = rows_by(attacks[1], student)["scaled_add_numerics"]
    assert row["points"] == "0" and "is not allowed in graded code" in row["message"], row


def test_the_frame_attack_is_real_without_the_guard():
    """In this process no guard is installed: the stolen expected output passes the check."""
    namespace = {}
    exec(compile(WALK_HELPERS + FRAME_THIEF.replace("WALK()", f"({WALKS['frames_getframe']})()"), "attack", "exec"),
         namespace)
    checks.check_scaled_add_numerics(namespace["scaled_add"], cases="visible")


def test_resetting_the_peak_inside_the_measured_call_is_refused(attacks):
    row = rows_by(attacks[1], "resets_peak")["scaled_add_memory"]
    assert row["points"] == "0" and "tried to reset the peak-memory statistics" in row["message"], row


@pytest.mark.parametrize("student, check", [("reads_hidden_checks", "bytes_of"), ("reads_solution", "bytes_of")])
def test_reading_the_grader_or_the_solution_from_disk_is_blocked(attacks, student, check):
    row = rows_by(attacks[1], student)[check]
    assert row["points"] == "0", row
    assert "may not read the grader's files" in row["message"] or "not implemented yet" in row["message"], row


@pytest.mark.parametrize("student", ["edits_test_cell", "relabels_test_cell"])
def test_code_in_a_test_cell_is_never_run(attacks, student):
    row = rows_by(attacks[1], student)["bytes_of"]
    assert row["points"] == "0" and "not implemented yet" in row["message"], row
    assert "locked cell bytes_of was edited" in row["message"]


def test_forged_result_lines_are_ignored(attacks):
    rows = rows_by(attacks[1], "forges_results")
    assert all(float(r["points"]) == 0 and r["status"] != "passed" for r in rows.values()), rows


def test_graded_code_has_no_network(attacks):
    if "network" not in attacks[2]:
        pytest.skip("this machine has no non-loopback address to try")
    row = rows_by(attacks[1], "network")["bytes_of"]
    assert row["points"] == "0" and row["status"] == "error", row


def test_graded_code_cannot_write_the_course(attacks):
    """Where the machine allows a mount namespace, the course is read-only for the notebook and what it starts."""
    if not sandbox.namespaces(str(attacks[1].resolve())).read_only:
        pytest.skip("this machine allows no mount namespace: the course is writable by the grading user")
    assert not attacks[3], "a process the notebook started wrote into the course folder"
    assert rows_by(attacks[1], "writes_the_course")["bytes_of"]["status"] == "passed"  # it only failed to write


def test_a_library_wrapping_its_own_function_is_not_a_change(monkeypatch):
    """PyTorch may wrap its functions lazily in any release (torch._dynamo does): library code around the library's
    function is never a change, whatever it wraps; a notebook's function in the same place is."""
    import functools
    import torch
    import torch._dynamo
    sandbox.learn_runtime_state()  # as the grader does first: the grader's runtime state is never compared (a weak
    before = sandbox.snapshot()    # reference a check left in contracts._earlier may die meanwhile)
    seed = torch.manual_seed
    monkeypatch.setattr(torch, "manual_seed", torch._dynamo.disable(seed))
    monkeypatch.setattr(torch, "allclose", functools.lru_cache(torch.allclose))
    assert sandbox.changes(before) == []
    monkeypatch.setattr(torch, "manual_seed", functools.wraps(seed)(lambda *a, **k: None))
    monkeypatch.setattr(torch.testing, "assert_close", torch._dynamo.disable(lambda *a, **k: None))
    assert sorted(sandbox.changes(before)) == ["torch.manual_seed", "torch.testing.assert_close"]


def test_unchanged_checks_of_attackers_still_grade(attacks):
    """The guards cost the attack, not the honest parts of the notebook graded before it."""
    assert rows_by(attacks[1], "frames_gc")["bytes_of"]["status"] == "passed"
    assert rows_by(attacks[1], "reads_hidden_checks")["scaled_add_numerics"]["status"] == "passed"


HOST_MEMORY_HOG = """
import math, torch
def bytes_of(shape, dtype):
    hog = torch.ones(2**30, dtype=torch.float32)  # 4 GiB of host memory, past a 3 GiB limit
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()
"""


def test_host_memory_limit_costs_only_the_check_that_passed_it(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the host limit is the parent's watchdog, tested on CPU here")
    subs = tmp_path / "subs"
    (subs / "hog").mkdir(parents=True)
    (subs / "hog" / f"{LESSON}.ipynb").write_text(json.dumps(_replace(load("solutions"), "bytes_of_solution", HOST_MEMORY_HOG)))
    proc = run_grader("--submissions", subs, "--workers", 1, "--out", tmp_path / "g", "--memory-gib", 3)
    rows = rows_by(tmp_path / "g", "hog")
    assert rows["bytes_of"]["status"] == "error" and "memory" in rows["bytes_of"]["message"], (rows, proc.stderr[-2000:])
    assert rows["scaled_add_numerics"]["status"] == rows["scaled_add_memory"]["status"] == "passed"
