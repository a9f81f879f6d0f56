"""How the grader isolates the code it grades. INSTRUCTORS.md's "What is isolated, and what is not" is the summary an
instructor reads; this module is the mechanism.

The parent's side (autograder.runner), enforced by the OS: `preexec` (a new session, RLIMIT_CPU / RLIMIT_AS /
RLIMIT_CORE), `namespaces` (probed once: a network namespace with loopback only, and a mount namespace in which the
course and the grades folder are read-only, as far as the machine allows them); the runner watches and kills a
child's whole process tree with course.processes.

The child's side (autograder.child's STARTUP), installed after the grader has imported what it needs and before the
notebook runs: `install_guards` (an audit hook: the grader's files, non-loopback sockets, and frame / heap / tracer
introspection from notebook code), `cap_gpu_memory`, and `snapshot` / `changes` (integrity: the grader's modules and
its patches, and library attributes replaced by code that is not the library's own).
An audit hook cannot be removed, but code in the same process can still defeat it through C (ctypes, a compiled
extension): these guards stop the known attacks, tested in tests/test_tamper.py, and the OS limits are the boundary.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import types
from dataclasses import dataclass

from course import ROOT
from course.lessons import reference_path, this_and_later, topic

# ================================================================================ the parent's side


@dataclass(frozen=True)
class Limits:
    """Resource limits of one grading process."""
    memory_bytes: int | None  # host memory: RLIMIT_AS (CPU-only machines) and the parent's RSS watchdog
    cpu_seconds: int | None  # RLIMIT_CPU of the whole process
    gpu_fraction: float | None  # torch.cuda.set_per_process_memory_fraction
    threads: int  # torch and OpenMP threads of the child


def default_memory_bytes(workers: int) -> int:
    """Each of `workers` processes may use its share of the machine's memory, at most 16 GiB."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(min(16 * 2**30, 0.8 * total / max(1, workers)))


def preexec(limits: Limits, address_space_limit: bool):
    """The function Popen runs in the child before exec: a new session (so the whole tree can be killed) and rlimits."""
    def apply() -> None:
        os.setsid()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if limits.cpu_seconds:
            resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
        if limits.memory_bytes and address_space_limit:
            # Address space, not resident memory: the CPU build of torch reserves little beyond what it touches.
            # Never on a GPU machine, where the CUDA driver reserves far more address space than memory.
            resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    return apply


NO_NETWORK_ENV = "MEMFIT_GRADE_NETWORK"  # "allow" turns the network namespace off (debugging)


@dataclass(frozen=True)
class Namespaces:
    """What a grading child runs inside, as far as the machine allows: a network namespace with loopback only, and a
    mount namespace in which the course and the grades folder are read-only (a notebook, or a process it starts,
    cannot rewrite the grader, the venv or the gradebook for the students after it), but for the folders the child
    must write: its temporary folder and the compilers' caches. Its results go over a pipe, which needs no path."""
    network: bool = False
    read_only: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()  # folders inside a read-only one that stay writable

    def prefix(self) -> tuple[str, ...]:
        """The command prefix that runs a program inside them; () for none."""
        if not (self.network or self.read_only):
            return ()
        setup = [*(["--loopback"] if self.network else []), *(f"--read-only={p}" for p in self.read_only),
                 *(f"--writable={p}" for p in self.writable)]
        return ("unshare", "--user", "--map-root-user", *(["--net"] if self.network else []),
                *(["--mount"] if self.read_only else []), sys.executable, "-m", "autograder.loopback", *setup, "--")


def _inside(path: str, folders) -> bool:
    return any(path != f and path.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


def _written_folders() -> list[str]:
    """The folders a child writes: its temporary folder, Triton's, Inductor's, matplotlib's and the XDG caches."""
    home = os.path.expanduser("~")
    wanted = [tempfile.gettempdir(), *(os.path.join(home, d) for d in (".triton", ".cache", ".config")),
              *(os.environ[k] for k in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME", "MPLCONFIGDIR")
                if os.environ.get(k))]
    return list(dict.fromkeys(os.path.realpath(p) for p in wanted))


def _made(path: str) -> bool:
    """A writable folder must exist to be bound over the read-only view."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return True


_PROBE = """
import json, os, socket, sys
network, read_only, writable = json.loads(sys.argv[1])
if network:
    s = socket.create_server(('127.0.0.1', 0))
    socket.create_connection(s.getsockname(), timeout=5).close()
assert not any(os.access(p, os.W_OK) for p in read_only), "still writable"
assert all(os.access(p, os.W_OK) for p in writable), "not writable"
print('ok')
"""


def _works(namespaces: Namespaces) -> bool:
    """Run a probe inside them: loopback connects, the read-only folders refuse writes, the writable ones take them."""
    probe = json.dumps([namespaces.network, namespaces.read_only, namespaces.writable])
    try:
        done = subprocess.run([*namespaces.prefix(), sys.executable, "-c", _PROBE, probe], capture_output=True,
                              text=True, timeout=30, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    except (OSError, subprocess.SubprocessError):
        return False
    return done.stdout.strip() == "ok"


@functools.lru_cache(maxsize=None)
def namespaces(grades_dir: str) -> Namespaces:
    """The most isolation this machine allows, probed once per grades folder: the network and the read-only view,
    else the network alone (a machine may allow unshare but not mount), else none (no unprivileged user
    namespaces: a GPU machine's container may not have them)."""
    if not shutil.which("unshare"):
        return Namespaces()
    written = _written_folders()  # a grades folder that is one of them (--out /tmp) stays writable
    read_only = tuple(p for p in dict.fromkeys(os.path.realpath(p) for p in (ROOT, grades_dir))
                      if os.path.isdir(p) and p not in written)
    writable = tuple(p for p in written if _inside(p, read_only) and _made(p))
    full = Namespaces(os.environ.get(NO_NETWORK_ENV) != "allow", read_only, writable)
    for candidate in (full, Namespaces(network=full.network)):
        if (candidate.network or candidate.read_only) and _works(candidate):
            return candidate
    return Namespaces()


# ================================================================================= the child's side


class GraderFileBlocked(PermissionError):
    pass


class IntrospectionBlocked(RuntimeError):
    pass


_BLOCKED_PATHS: list[str] = []
_LOOPBACK = ("127.0.0.1", "::1", "localhost", "0.0.0.0", "", None)
# Events through which code reaches frames (and so the grader's local variables), the heap or the tracer.
_INTROSPECTION_EVENTS = {"sys._getframe", "sys._current_frames", "sys._current_exceptions", "gc.get_objects",
                         "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile", "exec", "compile"}
_FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"}
_INTERMEDIARIES = ("inspect.py", "traceback.py")  # stdlib modules that introspect on their caller's behalf
_busy = threading.local()


def _from_notebook(depth: int = 2) -> bool:
    """Does the code that raised this event come from a notebook cell (directly, or through inspect/traceback)?"""
    frame = sys._getframe(depth)  # 0: here, 1: _audit, 2: the code that raised the event (C functions have none)
    from memfit.notebook import CELL_FILENAME
    for _ in range(3):
        if frame is None:
            return False
        name = frame.f_code.co_filename
        if CELL_FILENAME.match(name):
            return True
        if not name.endswith(_INTERMEDIARIES):
            return False
        frame = frame.f_back
    return False


def _audit(event: str, args: tuple) -> None:
    if event == "open":
        if _blocked_path(args[0]):
            raise GraderFileBlocked(f"graded code may not read the grader's files ({args[0]})")
    elif event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        address = args[1] if len(args) > 1 else None
        if isinstance(address, tuple) and address and address[0] not in _LOOPBACK:
            raise PermissionError(f"graded code has no network (tried to reach {address[0]})")
    elif event == "socket.getaddrinfo":
        if args and args[0] not in _LOOPBACK:
            raise PermissionError(f"graded code has no network (tried to look up {args[0]})")
    elif event in _INTROSPECTION_EVENTS or (event == "object.__getattr__" and args[1] in _FRAME_ATTRIBUTES):
        if getattr(_busy, "on", False):  # _from_notebook's own sys._getframe
            return
        _busy.on = True
        try:
            blocked = _from_notebook()
        finally:
            _busy.on = False
        if blocked:
            what = f"{event} {args[1]}" if event == "object.__getattr__" else event
            raise IntrospectionBlocked(f"{what} is not allowed in graded code: a function must compute its "
                                       "answer from its arguments, not from the grader's frames or memory")


def _blocked_path(path) -> bool:
    if isinstance(path, int):
        return False
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    if real.startswith("/proc/") and real.endswith("/mem"):
        return True
    return any(real == p or real.startswith(p + os.sep) for p in _BLOCKED_PATHS)


_installed = False


def blocked_paths(lesson: str, extra_blocked=()) -> list:
    """What graded code of `lesson` may not open: the grader, the solutions, the course's own tests (their right
    alternatives are answers), its history, and the references of this lesson and every later one (their sources
    and compiled caches)."""
    sources = [reference_path(later) for later in this_and_later(lesson)]
    compiled = sources[0].parent / "__pycache__"
    cached = [compiled / name for name in (os.listdir(compiled) if compiled.is_dir() else ())
              if name.split(".")[0] in {s.stem for s in sources}]
    return [ROOT / "autograder", ROOT / "solutions", ROOT / "tests", ROOT / ".git", *sources, *cached,
            *extra_blocked]


def install_guards(lesson: str, extra_blocked: list[str] = ()) -> None:
    """Block reads of the grader's files and non-loopback sockets for the rest of the process (audit hooks
    cannot be removed). Call after the grader has imported everything it needs."""
    global _installed
    _BLOCKED_PATHS[:] = [os.path.realpath(p) for p in blocked_paths(lesson, extra_blocked)]
    learn_runtime_state()  # reads the grader's sources, which are blocked from here on
    if not _installed:
        sys.addaudithook(_audit)
        _installed = True


def cap_gpu_memory(fraction: float | None) -> None:
    import torch
    if fraction and torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(fraction)


def limit_threads(threads: int) -> None:
    import torch
    torch.set_num_threads(max(1, threads))


def fill_uninitialized_memory() -> None:
    """torch.empty and its kin return NaN (integers: their largest value), not whatever the memory last held.

    A kernel that leaves part of its output unwritten then fails the same way every time it is graded; with
    recycled memory its message quoted different garbage from run to run (the 100-student record), and now the
    numerics checks can say "never written". PyTorch fills only in its deterministic mode; warn_only keeps the
    ops without a deterministic implementation running (they warn). Called again before every check, so a
    notebook that turns the mode off does not keep it off."""
    import torch
    torch.utils.deterministic.fill_uninitialized_memory = True
    torch.use_deterministic_algorithms(True, warn_only=True)


# ------------------------------------------------------------------------------------------- integrity
#
# Compared before the notebook loads, after it loads and after each check:
# * the grader's own modules (autograder, course, memfit but the lessons' references), and the grader's patches on the
#   libraries (the meter's reset guards): any change counts, but to the grader's runtime state (the globals its own
#   functions rebind: a server started during a check, a flag, `_rebound_globals`), which is never compared;
# * the attributes of the libraries the checks call: a replaced one counts only when its new value is not that
#   library's own code (`_library_code`). A wrapper PyTorch installs lazily (torch._dynamo wraps torch.manual_seed
#   when first imported) is PyTorch's code around PyTorch's function, so no release can trip the check, and no list
#   of such wrappers is kept; a lambda, a class, a grader function or a standard-library function put in place does.

GRADER_PACKAGES = ("autograder", "course", "memfit")
LIBRARY_MODULES = ("torch", "torch.testing", "torch.testing._comparison", "torch.nn.functional", "torch.cuda",
                   "torch.cuda.memory", "torch._C", "numpy", "numpy.testing", "triton", "triton.language",
                   "math", "builtins", "gc", "sys", "os")
_GRADER_CODE = tuple(str(ROOT / package) + os.sep for package in GRADER_PACKAGES)
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
_SITE_PACKAGES = tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("purelib", "platlib")})
_INSTALLED = (*_SITE_PACKAGES, _STDLIB)


def _grader_modules() -> list[types.ModuleType]:
    return [m for n, m in list(sys.modules.items()) if isinstance(m, types.ModuleType)
            and n.split(".")[0] in GRADER_PACKAGES and not n.startswith("memfit.from_lessons")]


def _fingerprint(value, strict: bool):
    if isinstance(value, (types.FunctionType, types.MethodType)):
        fn = getattr(value, "__func__", value)
        return id(value), id(fn.__code__), id(fn.__defaults__), id(fn.__kwdefaults__)
    if isinstance(value, type):
        return id(value), tuple(sorted((k, _fingerprint(v, False)) for k, v in list(vars(value).items())
                                       if not k.startswith("__") or k in ("__init__", "__call__", "__eq__")))
    if strict and isinstance(value, (list, dict, tuple, set, frozenset)):
        try:
            return id(value), repr(value)
        except Exception:  # noqa: BLE001
            return (id(value),)
    return (id(value),)


def _owned(value, module: types.ModuleType) -> bool:
    """Classes are compared where they are defined, not in every module that imports them."""
    return not isinstance(value, type) or getattr(value, "__module__", None) == module.__name__


_RUNTIME: dict[str, frozenset] = {}  # module -> the globals its own functions rebind: the grader's runtime state


def _rebound_globals(path: str) -> frozenset:
    """The names a module's functions declare `global` and so rebind while the grader runs (a server started on
    first use, a cache, a flag): runtime state, not something graded code could have changed. Containers the grader
    fills at run time are rebound (x = x + ...), never filled in place, so that they are marked so here."""
    import ast
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    return frozenset(n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names)


def learn_runtime_state() -> None:
    for module in _grader_modules():
        path = getattr(module, "__file__", None)
        if module.__name__ not in _RUNTIME and path:
            _RUNTIME[module.__name__] = _rebound_globals(path)


def _grader_fingerprints() -> dict[tuple[str, str], tuple]:
    """Every global of the grader's modules, but its runtime state (`_rebound_globals`); the contents of autograder's
    and course's containers too (the cases)."""
    prints = {}
    for module in _grader_modules():
        strict = module.__name__.split(".")[0] in ("autograder", "course")
        runtime = _RUNTIME.get(module.__name__, frozenset())
        for name, value in list(vars(module).items()):
            if not name.startswith("__") and name not in runtime and _owned(value, module):
                prints[(module.__name__, name)] = _fingerprint(value, strict)
    return prints


def _watched(value) -> bool:
    """Library attributes worth comparing: code and modules (a setting or a constant is no check's tool)."""
    return callable(value) or isinstance(value, (types.ModuleType, staticmethod, classmethod, property))


def _library_attributes() -> dict[tuple[str, str], object]:
    """(where, name) -> value of the callables, classes and modules of the library modules the checks call, and of
    the attributes of the classes those define (torch.Tensor's methods among them)."""
    found = {}
    for module in (sys.modules[n] for n in LIBRARY_MODULES if n in sys.modules):
        for name, value in list(vars(module).items()):
            if name.startswith("__") or not _watched(value):
                continue
            found[(module.__name__, name)] = value
            if isinstance(value, type) and _owned(value, module):
                found.update(((f"{module.__name__}.{value.__qualname__}", k), v) for k, v in list(vars(value).items())
                             if _watched(v))
    import torch
    for cls in (torch.Tensor, torch._C.TensorBase):
        found.update(((f"{cls.__module__}.{cls.__qualname__}", k), v) for k, v in list(vars(cls).items()) if _watched(v))
    return found


def unwrapped(value) -> list:
    """The value, then what it wraps, down to the innermost: a method's function, a partial's, a property's getter,
    and `__wrapped__` (functools.wraps), read without running the value's own code."""
    layers = [value]
    for _ in range(20):
        v = layers[-1]
        if isinstance(v, (types.MethodType, staticmethod, classmethod)):
            inner = v.__func__
        elif isinstance(v, functools.partial):
            inner = v.func
        elif isinstance(v, property):
            inner = v.fget
        else:
            try:
                inner = inspect.getattr_static(v, "__wrapped__", None)
            except Exception:  # noqa: BLE001
                inner = None
        if inner is None or any(inner is seen for seen in layers):
            break
        layers.append(inner)
    return layers


def _compiled_in_libraries(fn: types.FunctionType) -> bool:
    """Compiled from an installed library's file (site-packages, the standard library), or generated at run time by
    one (dataclasses, namedtuple: "<string>"; graded code may not compile), never from a notebook cell."""
    from memfit.notebook import CELL_FILENAME
    name = fn.__code__.co_filename
    if name.startswith("<"):
        return not CELL_FILENAME.match(name)
    return os.path.realpath(name).startswith(_INSTALLED)


def _in_folder_of(library: str, path: str) -> bool:
    """Is the file the library's: under its package's folder (the standard library's, outside site-packages)?"""
    path = os.path.realpath(path)
    if library in sys.stdlib_module_names:
        return path.startswith(_STDLIB) and not path.startswith(_SITE_PACKAGES)
    package = getattr(sys.modules.get(library), "__file__", None)
    return bool(package) and path.startswith(os.path.dirname(os.path.realpath(package)) + os.sep)


def _in_modules_of(library: str, module_name) -> bool:
    top = module_name.split(".")[0] if isinstance(module_name, str) else ""
    return top in sys.stdlib_module_names if library in sys.stdlib_module_names else top == library


_C_DESCRIPTORS = (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType,
                  types.GetSetDescriptorType, types.MemberDescriptorType)


def _belongs_to(library: str, value) -> bool:
    """Is the innermost layer the library's own: a function or module from its folder (a function generated at run
    time: from its modules), or a class, C function or object of its modules?"""
    if isinstance(value, types.FunctionType):
        name = value.__code__.co_filename
        return _in_modules_of(library, value.__module__) if name.startswith("<") else _in_folder_of(library, name)
    if isinstance(value, types.ModuleType):
        path = vars(value).get("__file__")
        return _in_folder_of(library, path) if path else \
            _in_modules_of(library, value.__name__) and value.__name__ in sys.builtin_module_names
    if isinstance(value, (type, types.BuiltinFunctionType)):
        owner = value.__module__
    elif isinstance(value, _C_DESCRIPTORS):  # a C class's method: that class's
        owner = value.__objclass__.__module__
    else:  # any other object: its type's
        owner = type(value).__module__
    return _in_modules_of(library, owner)


def _library_code(value, library: str) -> bool:
    """The library's own code: every function on the way down its wrappers compiled in the installed libraries, and
    the innermost one the library's own."""
    layers = unwrapped(value)
    return all(_compiled_in_libraries(v) for v in layers if isinstance(v, types.FunctionType)) \
        and _belongs_to(library, layers[-1])


def _grader_code(value) -> bool:
    return any(isinstance(v, types.FunctionType) and v.__code__.co_filename.startswith(_GRADER_CODE)
               for v in unwrapped(value))


@dataclass
class Snapshot:
    grader: dict[tuple[str, str], tuple]  # fingerprints of the grader's globals
    library: dict[tuple[str, str], object]  # the library attributes' values themselves (an id could be reused)
    classes: set[str]  # the library classes whose members were recorded ("torch.Tensor", ...)


def snapshot() -> Snapshot:
    library = _library_attributes()
    return Snapshot(_grader_fingerprints(), library, {where for where, _ in library if where not in LIBRARY_MODULES})


def changes(before: Snapshot) -> list[str]:
    """What the notebook changed since `before` ("autograder.checks.numerics.RTOL", "torch.allclose", ...): a global of
    the grader's; a grader patch on a library (the meter's reset guards), replaced or removed; a library attribute
    replaced or added by code that is not the library's own."""
    grader, library = _grader_fingerprints(), _library_attributes()
    changed = [key for key, fp in before.grader.items() if grader.get(key) != fp]
    for key, now in library.items():  # added ones too where they shadow what a class inherits (torch.Tensor.__eq__)
        was = before.library.get(key)
        if was is None and key[0] not in before.classes or now is was:
            continue
        if (was is not None and _grader_code(was)) or not _library_code(now, key[0].split(".")[0]):
            changed.append(key)
    changed += [key for key, was in before.library.items() if key not in library and _grader_code(was)]
    return [f"{where}.{name}" for where, name in changed]
