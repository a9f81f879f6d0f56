"""A notebook as a module, without Jupyter: read the .ipynb as JSON and execute its graded code.

Executed: every code cell except nbgrader test cells (checks belong to whoever grades, never to the notebook) and
cells tagged "demo" (plots, benchmarks, try-it cells: slow and not graded). Each cell runs with a time limit; a cell
that raises or hangs is recorded and skipped, so one broken cell costs only the functions it defines. Jupyter magics
(% and ! lines) become `pass`.

In the library because a rank of memfit.dist loads the learner's class from "notebook.ipynb::Name" by itself; the
course layer (course.notebook_loader) adds what grading needs: the released lesson, its locked cells, the solutions.
"""
from __future__ import annotations

import json
import linecache
import os
import re
import signal
import sys
import threading
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path

LESSON_NAME = re.compile(r"^(\d\d)_[a-z0-9_]+$")
DEMO_TAG = "demo"


class NotebookError(Exception):
    """A notebook that cannot be graded at all. str() is one line naming the file and problem."""


class CellTimeout(Exception):
    pass


class CellExited(Exception):
    """A cell called os._exit while the notebook was loading."""


def _refuse_exit(status=0):
    raise CellExited(f"os._exit({status}) called while the notebook was loading")


@dataclass
class CellError:
    index: int  # 1-based position among the notebook's cells
    summary: str  # "NameError: name 'x' is not defined"

    def __str__(self) -> str:
        return f"cell {self.index}: {self.summary}"


@dataclass
class LoadedNotebook:
    path: Path
    lesson: str
    module: types.ModuleType
    errors: list[CellError] = field(default_factory=list)


def read_notebook(path: str | Path) -> dict:
    """The notebook's JSON, or NotebookError with a one-line reason."""
    path = Path(path)
    if not path.exists():
        raise NotebookError(f"{path}: no such notebook")
    if path.is_dir():
        raise NotebookError(f"{path}: is a folder, not a notebook")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise NotebookError(f"{path}: cannot be read ({exc.__class__.__name__}: {exc})") from None
    if not text.strip():
        raise NotebookError(f"{path}: is empty, not a notebook")
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookError(f"{path}: is not valid notebook JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError(f"{path}: is JSON but not a Jupyter notebook (it has no list of cells)")
    if nb.get("nbformat") != 4:
        raise NotebookError(f"{path}: has nbformat {nb.get('nbformat')!r}; the course reads version 4 notebooks")
    return nb


def lesson_of(nb: dict, path: str | Path) -> str:
    """The lesson a notebook belongs to: its metadata's memfit.lesson, checked against its file name."""
    path = Path(path)
    stem = path.stem
    meta = (nb.get("metadata") or {}).get("memfit") or {}
    declared = meta.get("lesson") if isinstance(meta, dict) else None
    if declared and LESSON_NAME.match(stem) and declared != stem:
        raise NotebookError(f"{path}: holds lesson {declared} (its metadata says so), not {stem}: "
                            "was another lesson's notebook saved under this name?")
    lesson = declared or stem
    if not LESSON_NAME.match(lesson):
        raise NotebookError(f"{path}: is not a course notebook (expected a name like 00_first_kernel.ipynb)")
    return lesson


def is_test_cell(cell: dict) -> bool:
    meta = (cell.get("metadata") or {}).get("nbgrader") or {}
    return bool(meta.get("grade")) and not meta.get("solution")


def is_demo_cell(cell: dict) -> bool:
    return DEMO_TAG in ((cell.get("metadata") or {}).get("tags") or [])


def cell_source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


_MAGIC = re.compile(r"^(\s*)[%!].*$", re.MULTILINE)


def strip_magics(source: str) -> str:
    return _MAGIC.sub(lambda m: f"{m.group(1)}pass", source)


def grade_id(cell: dict) -> str | None:
    meta = (cell.get("metadata") or {}).get("nbgrader") or {}
    return meta.get("grade_id") if isinstance(meta, dict) else None


def graded_cells(nb: dict, test_ids: frozenset = frozenset()) -> list[tuple[int, str]]:
    """(1-based cell index, source) of the code the grader executes, in notebook order. A cell whose grade_id
    is a test cell of the released lesson (test_ids) is skipped whatever its metadata now says."""
    return [(i, strip_magics(cell_source(c))) for i, c in enumerate(nb["cells"], start=1)
            if c.get("cell_type") == "code" and not is_test_cell(c) and not is_demo_cell(c)
            and grade_id(c) not in test_ids]


def _run_cell(code, namespace: dict, timeout_s: float | None) -> None:
    if not timeout_s or threading.current_thread() is not threading.main_thread():
        exec(code, namespace)
        return

    def on_alarm(_signum, _frame):
        raise CellTimeout(f"did not finish within {timeout_s:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        exec(code, namespace)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def load_notebook(path: str | Path, cell_timeout_s: float | None = 60.0,
                  test_ids: frozenset = frozenset(), nb: dict | None = None) -> LoadedNotebook:
    """Execute a notebook's graded code into a fresh module (test_ids: see graded_cells; nb: its JSON, when
    already read)."""
    path = Path(path)
    nb = nb if nb is not None else read_notebook(path)
    lesson = lesson_of(nb, path)
    module = types.ModuleType(f"notebook_{lesson}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    loaded = LoadedNotebook(path, lesson, module)
    real_exit, os._exit = os._exit, _refuse_exit  # a stray os._exit costs its cell, not the notebook
    try:
        _run_cells(nb, path, module, loaded, cell_timeout_s, test_ids)
    finally:
        os._exit = real_exit
    return loaded


CELL_FILENAME = re.compile(r"^<.+\.ipynb cell \d+>$")  # the file name of code compiled from a notebook's cells


def compile_cell(source: str, path: Path, index: int):
    """Compile one cell's code under a name that tracebacks show. Triton's @jit reads a kernel's source
    back through linecache, as it does in Jupyter, so the source is registered there."""
    # the folder too: Triton's interpreter reads a kernel's source back by this name when it first runs it, so a
    # lesson's stub and its solution (or two students' notebooks) loaded in one process must not share names
    filename = f"<{Path(path).parent.name}/{Path(path).name} cell {index}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return compile(source, filename, "exec")


def _run_cells(nb, path, module, loaded, cell_timeout_s, test_ids) -> None:
    for index, source in graded_cells(nb, test_ids):
        try:
            code = compile_cell(source, path, index)
            _run_cell(code, module.__dict__, cell_timeout_s)
        except (Exception, CellTimeout, SystemExit, KeyboardInterrupt) as exc:
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            loaded.errors.append(CellError(index, last))
