"""What grading needs beyond loading a notebook (memfit.notebook): the released lesson a submission came from, the
locked cells it must not have edited (nbgrader's checksums), and the course's own solutions as modules.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import types

from course import ROOT
from course.lessons import solution_path
from memfit.notebook import NotebookError, cell_source, grade_id, is_test_cell, load_notebook, read_notebook


def nbgrader_checksum(cell: dict) -> str:
    """nbgrader's checksum of a cell (nbgrader.utils.compute_checksum), without importing nbgrader."""
    meta = cell["metadata"]["nbgrader"]
    grade, solution, locked = bool(meta.get("grade")), bool(meta.get("solution")), bool(meta.get("locked"))
    locked = locked or solution or grade  # nbgrader.utils.is_locked: solution cells are not locked
    locked = False if solution else locked
    m = hashlib.md5()
    for part in (cell_source(cell), cell.get("cell_type", ""), str(grade), str(solution), str(locked), meta["grade_id"]):
        m.update(part.encode("utf-8"))
    if grade:
        m.update(str(float(meta["points"])).encode("utf-8"))
    return m.hexdigest()


def release_of(lesson: str) -> dict | None:
    """The released lesson (lessons/NN_topic.ipynb, what learners were given), or None."""
    try:
        return read_notebook(ROOT / "lessons" / f"{lesson}.ipynb")
    except NotebookError:
        return None


def locked_cell_problems(nb: dict, release: dict, solution: dict | None = None) -> list[str]:
    """The released notebook's locked cells (the visible test cells) that the submission edited or deleted,
    found by nbgrader's checksums: the release's stored checksum against the submission's recomputed one
    (the solution notebook's version of a cell, with its hidden tests, is accepted too)."""
    submitted = {grade_id(c): c for c in nb["cells"] if grade_id(c)}
    instructor = {grade_id(c): cell_source(c) for c in (solution or {}).get("cells", []) if grade_id(c)}
    problems = []
    for cell in release["cells"]:
        meta = (cell.get("metadata") or {}).get("nbgrader") or {}
        if not meta.get("locked") or "checksum" not in meta:
            continue
        mine = submitted.get(meta["grade_id"])
        if mine is None:
            problems.append(f"locked cell {meta['grade_id']} was deleted")
            continue
        try:
            edited = nbgrader_checksum({**mine, "metadata": {"nbgrader": {**meta, "grade_id": meta["grade_id"]}}}) != meta["checksum"]
        except (KeyError, TypeError, AttributeError):
            edited = True
        if edited and instructor.get(meta["grade_id"]) == cell_source(mine):
            edited = False
        if edited:
            problems.append(f"locked cell {meta['grade_id']} was edited")
    return problems


def test_cell_ids(release: dict | None) -> frozenset:
    return frozenset(grade_id(c) for c in (release or {}).get("cells", []) if is_test_cell(c) and grade_id(c))


def load_solution(lesson: str) -> types.ModuleType:
    """The reference solution of a lesson as a module (for tests and benchmarks)."""
    with contextlib.redirect_stdout(io.StringIO()):  # the notebook's prints are for learners
        loaded = load_notebook(solution_path(lesson), cell_timeout_s=None)
    if loaded.errors:
        raise RuntimeError(f"solutions/{lesson}.ipynb did not load cleanly: " + "; ".join(map(str, loaded.errors)))
    return loaded.module
