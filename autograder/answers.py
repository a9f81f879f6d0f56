"""The course's answers are out of reach of the code being graded.

The checks compute their expected values with the lessons' reference code (memfit.from_lessons.<topic>, generated
from the solution notebooks). While a lesson is graded, graded code may use the references of earlier lessons (a
lesson's text says so where it builds on one) but not those of the lesson being graded or of any later lesson: they
hold its answers. `seal(lesson)`, one of the grading child's start-up steps, makes that so in three layers:

* **Import.** The forbidden reference modules leave sys.modules (the checks keep their own handles), and a finder
  refuses to import them again: `from memfit.from_lessons.model_states import count_params` in a notebook cell
  raises "lesson 01's reference is not available to graded code: write your own".
* **Reach.** Whatever a learner's function can reach through its globals, closures and defaults, down through the
  notebook's own functions and classes, must not be reference code (a function, class or Triton kernel defined in a
  forbidden reference file, or such a module): `answer_used(fn)` runs before each check, so an import that got
  through some other way, a subclass or a copy of a reference's code scores 0.
* **Calls.** Every function and method defined in a forbidden reference file is replaced, wherever the grader holds
  it, by a tripwire: called with graded code as its nearest course caller, it records the use and raises. The
  checks calling the reference, and the reference calling itself, pass through; so do the earlier exercises a check
  gives a learner's function on purpose (autograder.checks.given_references).

An in-process guard stops importing, wrapping, subclassing and copying by reference; code written to dig a function
out of a closure is the OS-level sandbox's business (autograder.sandbox), as any other attack on the grader is.
"""
from __future__ import annotations

import functools
import importlib.abc
import inspect
import os
import sys
import sysconfig
import types

from autograder.sandbox import unwrapped
from course.lessons import reference_path, this_and_later, topic

REFERENCE_PACKAGE = "memfit.from_lessons"
_LIBRARIES = tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "purelib", "platlib")})
_HERE = os.path.realpath(__file__)


class AnswerUsed(BaseException):
    """Graded code called a reference it may not use. A BaseException, so `except Exception` in graded code does not
    hide it; the use is recorded anyway (`used()`)."""


def message(lesson: str, what: str | None = None) -> str:
    said = f"lesson {lesson.split('_', 1)[0]}'s reference is not available to graded code: write your own"
    return f"{what}: {said}" if what else said


# ------------------------------------------------------------------------------------------- the state of one child

# Filled once by seal(), before the grader's integrity snapshot (autograder.sandbox), so graded code that changes
# them is caught as tampering:
_sealed: dict[str, str] = {}  # reference module name -> its lesson
_files: dict[str, str] = {}  # realpath of a forbidden reference file -> its lesson
# Runtime state, rebound (never filled in place: the snapshot leaves out what a module's functions rebind):
_given: tuple[int, ...] = ()  # ids of the tripwires given_references hands to graded code now (one per block)
_used: tuple[str, ...] = ()  # what graded code used, in order (the first one is reported)


def sealed() -> bool:
    return bool(_sealed)


def used() -> str | None:
    """The message for the first forbidden use recorded since `forget()`, or None."""
    return _used[0] if _used else None


def forget() -> None:
    global _used
    _used = ()


class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in _sealed:
            raise ImportError(message(_sealed[name]), name=name)
        return None


def seal(lesson: str) -> None:
    """Put the references of `lesson` and every later lesson out of reach (see the module's docstring). Call after
    the grader has imported everything it needs and before graded code runs."""
    for later in this_and_later(lesson):  # the lessons whose answers graded code of `lesson` may not use
        _sealed[f"{REFERENCE_PACKAGE}.{topic(later)}"] = later
        _files[os.path.realpath(reference_path(later))] = later
    modules = {name: sys.modules.pop(name) for name in _sealed if name in sys.modules}
    package = sys.modules.get(REFERENCE_PACKAGE)
    for name in modules:
        if package is not None and name.rsplit(".", 1)[1] in vars(package):
            delattr(package, name.rsplit(".", 1)[1])
    if not any(isinstance(f, _Refuse) for f in sys.meta_path):
        sys.meta_path.insert(0, _Refuse())
    _arm(modules)


def _defined_in_forbidden(value) -> str | None:
    """The lesson whose forbidden reference file defines this function, class or Triton kernel, or None."""
    value = _inner(value)
    code = getattr(getattr(value, "fn", value), "__code__", None)  # a Triton kernel's Python function is .fn
    if isinstance(code, types.CodeType):
        return _files.get(os.path.realpath(code.co_filename)) if not code.co_filename.startswith("<") else None
    if isinstance(value, type):
        return _sealed.get(getattr(value, "__module__", None))
    return None


# ------------------------------------------------------------------------------------------- tripwires

def _nearest_course_frame(frame) -> types.FrameType | None:
    """The first frame, from `frame` outwards, that is neither a library's nor this module's: the caller that
    matters (torch.autograd's apply, functools and the interpreter's frames are skipped)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith("<frozen") or name == "<string>" or os.path.realpath(name) == _HERE
                or (not name.startswith("<") and os.path.realpath(name).startswith(_LIBRARIES))):
            return frame
        frame = frame.f_back
    return None


def _graded(frame) -> bool:
    from memfit.notebook import CELL_FILENAME
    return frame is not None and bool(CELL_FILENAME.match(frame.f_code.co_filename))


def _tripwire(fn: types.FunctionType, lesson: str, what: str):
    @functools.wraps(fn, updated=())
    def tripwire(*args, **kwargs):
        global _used
        if id(tripwire) not in _given and _graded(_nearest_course_frame(sys._getframe(1))):
            _used = (*_used, message(lesson, f"your code called {what}"))
            raise AnswerUsed(_used[-1])
        return fn(*args, **kwargs)
    del tripwire.__wrapped__  # graded code gets no handle on the unguarded function from here
    tripwire.__signature__ = inspect.signature(fn)
    tripwire.__course_answer__ = lesson
    return tripwire


def _arm(modules: dict[str, types.ModuleType]) -> None:
    """Replace each function defined in a forbidden reference file by its tripwire, wherever a module of the course
    holds it (the reference itself, later references importing it, the checks), and wrap the methods of the classes
    defined there in place."""
    wires: dict[int, object] = {}
    classes = []
    for module in modules.values():
        for name, value in list(vars(module).items()):
            lesson = _defined_in_forbidden(value)
            if lesson is None:
                continue
            if isinstance(value, type):
                if value not in classes:
                    classes.append(value)
            elif callable(value) and isinstance(_inner(value), types.FunctionType) and id(value) not in wires:
                # (a Triton kernel unwraps to itself, not to a function: it is left alone)
                wires[id(value)] = _tripwire(value, lesson, _inner(value).__qualname__)
    for cls in classes:
        lesson = _sealed[cls.__module__]
        for name, member in list(vars(cls).items()):
            method = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
            if callable(method) and isinstance(_inner(method), types.FunctionType) and _defined_in_forbidden(method):
                wire = _tripwire(method, lesson, f"{cls.__qualname__}.{name}")
                setattr(cls, name, type(member)(wire) if method is not member else wire)
    holders = [m for n, m in list(sys.modules.items()) if isinstance(m, types.ModuleType)
               and n.split(".")[0] in ("memfit", "autograder", "course")]
    for module in [*modules.values(), *holders]:
        for name, value in list(vars(module).items()):
            if id(value) in wires and not name.startswith("__"):
                setattr(module, name, wires[id(value)])


class handed_to_graded_code:
    """While active, these tripwires may be called by graded code: a check gives a learner's function an earlier
    exercise's reference on purpose (autograder.checks.given_references)."""

    def __init__(self, values):
        self.ids = [id(v) for v in values if getattr(v, "__course_answer__", None)]

    def __enter__(self):
        global _given
        _given = (*_given, *self.ids)
        return self

    def __exit__(self, *exc):
        global _given
        remaining = list(_given)
        for i in self.ids:
            remaining.remove(i)
        _given = tuple(remaining)
        return False


# ------------------------------------------------------------------------------------------- what a function reaches

def _inner(value):
    """What runs when `value` is called: partials, bound, static and class methods and decorators that keep
    `__wrapped__` (functools.wraps, lru_cache, torch.no_grad) unwrapped."""
    return unwrapped(value)[-1]


def answer_used(*objects) -> str | None:
    """The message naming the first forbidden reference that these learner objects are or can reach (their globals,
    closures and defaults, through the notebook's own functions and classes), or None."""
    from memfit.notebook import CELL_FILENAME
    seen: set[int] = set()
    todo = [(o, getattr(o, "__name__", "your function")) for o in objects]
    while todo:
        value, where = todo.pop()
        value = _inner(value)
        if id(value) in seen:
            continue
        seen.add(id(value))
        lesson = getattr(value, "__course_answer__", None) if isinstance(value, types.FunctionType) else None
        lesson = lesson or _defined_in_forbidden(value)
        if isinstance(value, types.ModuleType):
            lesson = _sealed.get(value.__name__)
        if lesson:
            name = getattr(value, "__qualname__", getattr(value, "__name__", "this object"))
            return message(lesson, f"{where} uses {name}")
        if isinstance(value, types.FunctionType) and CELL_FILENAME.match(value.__code__.co_filename):
            todo += [(v, where) for v in _reached(value)]
        elif isinstance(value, type) and value.__module__.startswith("notebook_"):
            for base in value.__mro__[1:]:
                todo.append((base, where))
            todo += [(v, where) for v in vars(value).values()]
        elif getattr(value, "fn", None) is not None and isinstance(getattr(value.fn, "__code__", None), types.CodeType):
            todo.append((value.fn, where))  # a Triton kernel: its Python function
    return None


def _reached(fn: types.FunctionType) -> list:
    """The objects a notebook function names: its globals (by the names its code, and the code nested in it, uses),
    the cells of its closure and its defaults."""
    names: set[str] = set()
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    found = [fn.__globals__[n] for n in names if n in fn.__globals__]
    found += [c.cell_contents for c in fn.__closure__ or () if _filled(c)]
    found += list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values())
    return found


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True
