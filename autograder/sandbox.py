"""How the grader isolates the code it grades. README's "What is isolated, and what is not" is the summary an
instructor reads; this module is the mechanism.

The parent's side (autograder.runner): `preexec` (a new session, RLIMIT_CPU / RLIMIT_AS / RLIMIT_CORE),
`network_wrapper` (a network namespace with loopback only, where `unshare -rn` works), `resident_bytes` and
`kill_tree` (the memory watchdog and the kill of everything a child started).

The child's side (autograder.child), installed after the grader has imported what it needs and before the notebook
runs: `install_guards` (an audit hook: the grader's files, non-loopback sockets, and frame / heap / tracer
introspection from notebook code), `cap_gpu_memory`, and `snapshot` / `changes` (the integrity fingerprints).
An audit hook cannot be removed, but code in the same process can still defeat it through C (ctypes, a compiled
extension): these guards stop the known attacks, tested in tests/test_tamper.py, and the OS limits are the boundary.
"""
from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
import sys
import sysconfig
import threading
import types
from dataclasses import dataclass

from course import ROOT

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


@functools.lru_cache(maxsize=1)
def network_wrapper() -> tuple[str, ...]:
    """The command prefix that runs a child with no network but loopback, or () where the OS does not allow it."""
    if os.environ.get(NO_NETWORK_ENV) == "allow" or not shutil.which("unshare"):
        return ()
    prefix = ("unshare", "--user", "--map-root-user", "--net", sys.executable, "-m", "autograder.loopback")
    probe = ("import socket; s = socket.create_server(('127.0.0.1', 0)); "
             "c = socket.create_connection(s.getsockname(), timeout=5); print('ok')")
    try:
        ok = subprocess.run([*prefix, sys.executable, "-c", probe], capture_output=True, text=True, timeout=30,
                            env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout.strip() == "ok"
    except (OSError, subprocess.SubprocessError):
        ok = False
    return prefix if ok else ()


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, session id) of every process, from /proc."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                table[int(entry.name)] = (int(fields[1]), int(fields[3]))
            except (OSError, IndexError, ValueError):
                continue
    return table


def process_tree(root: int) -> list[int]:
    """The child and everything it started: its session, and descendants that started sessions of their own
    (lesson 03's ranks do)."""
    table = _processes()
    tree = {pid for pid, (_, session) in table.items() if session == root} | {root}
    grew = True
    while grew:
        more = {pid for pid, (parent, _) in table.items() if parent in tree and pid not in tree}
        tree |= more
        grew = bool(more)
    return sorted(tree)


def resident_bytes(root: int) -> int:
    """Resident memory of the child's process tree."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def kill_tree(root: int) -> None:
    """SIGKILL the child's process tree (its session, and descendants in sessions of their own)."""
    for pid in process_tree(root):
        try:
            os.kill(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass


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


def install_guards(lesson: str, extra_blocked: list[str] = ()) -> None:
    """Block reads of the grader's files and non-loopback sockets for the rest of the process (audit hooks
    cannot be removed). Call after the grader has imported everything it needs."""
    global _installed
    topic = lesson.split("_", 1)[1]
    _BLOCKED_PATHS[:] = [os.path.realpath(p) for p in (
        ROOT / "autograder", ROOT / "solutions", ROOT / "memfit" / "from_lessons" / f"{topic}.py",
        ROOT / "tests" / f"test_checks_{topic}.py", *extra_blocked)]
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

def _watched_modules() -> list[types.ModuleType]:
    names = ("torch", "torch.testing", "torch.testing._comparison", "torch.nn.functional", "torch.cuda",
             "torch.cuda.memory", "torch._C", "math", "builtins", "numpy", "numpy.testing", "triton",
             "triton.language", "gc", "sys", "os")
    mods = [sys.modules[n] for n in names if n in sys.modules]
    mods += [m for n, m in list(sys.modules.items())
             if isinstance(m, types.ModuleType) and (n in ("autograder", "course")
                                                     or n.startswith(("autograder.", "course.", "memfit.")))
             and not n.startswith("memfit.from_lessons")]
    return mods


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
    """Classes are fingerprinted where they are defined, not in every module that imports them."""
    return not isinstance(value, type) or getattr(value, "__module__", None) == module.__name__


Snapshot = dict


def snapshot() -> Snapshot:
    """Fingerprints of what the checks rely on: every global of the grader's and memfit's modules (contents of
    containers included), and every function, class and submodule of the torch/numpy modules they use."""
    snap = {}
    for module in _watched_modules():
        grader = module.__name__.split(".")[0] in ("autograder", "course", "memfit")
        for name, value in list(vars(module).items()):
            if name.startswith("__") or not _owned(value, module):
                continue
            if grader or callable(value) or isinstance(value, types.ModuleType):
                snap[(module.__name__, name)] = _fingerprint(value, strict=grader and module.__name__.split(".")[0] in ("autograder", "course"))
    import torch
    for cls in (torch.Tensor, torch._C.TensorBase):
        for name, value in list(vars(cls).items()):
            snap[(cls.__qualname__, name)] = (id(value),)
    return snap


_LIBRARIES = tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("purelib", "platlib", "stdlib")})


def _library_wrapper(module: str, name: str, original_id: int) -> bool:
    """Is the new value a library's own wrapper of the original? (torch._dynamo, imported lazily, wraps
    torch.manual_seed in place.) Every wrapper on the way must be code of an installed library, not of the course
    or a notebook."""
    value = getattr(sys.modules.get(module), name, None)
    for _ in range(5):
        code = getattr(getattr(value, "__func__", value), "__code__", None)
        if code is None or not os.path.realpath(code.co_filename).startswith(_LIBRARIES):
            return False
        value = getattr(value, "__wrapped__", None)
        if id(value) == original_id:
            return True
    return False


def changes(before: Snapshot) -> list[str]:
    """What the notebook changed since `before` ("torch.allclose", "autograder.checks.numerics.RTOL", ...)."""
    now = snapshot()
    return [f"{mod}.{name}" for (mod, name), fp in before.items() if now.get((mod, name)) != fp
            and not (mod.split(".")[0] not in ("autograder", "course", "memfit") and _library_wrapper(mod, name, fp[0]))]
