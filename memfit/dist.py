"""Run a function on N ranks of torch.distributed, from a notebook cell, a check or a test.

    results = run_ranks("memfit.dist:demo_all_reduce", world_size=2)        # a module's function
    results = run_ranks("lessons/03_zero.ipynb::zero_step", world_size=2)   # a notebook's function
    results = run_ranks(my_function, world_size=2, args=dict(x=1))           # a function of this process

A string target starts fresh interpreters (what NCCL needs: CUDA must not be initialised before a
fork); on a machine without a GPU its gloo ranks are forked from memfit.rank_server, a process that
imported torch once and has run nothing since, so they start in milliseconds instead of seconds. A
function object is run in forked copies of this process (Linux, macOS), so a function or class
defined in a notebook cell reaches the ranks without being importable; its args may be any Python
objects. Forking is for CPU ranks (gloo).

Each rank is its own Python process, started with a fresh rendezvous port (never a fixed one; when another
process binds it first, as parallel tests can, the world starts again on another). The
function is called as fn(rank, world_size, **args) after init_process_group, and returns something
JSON can write. The launcher owns the processes: when a rank exits with an error the others are
killed at once, when the time limit passes all are killed, and either way DistributedFailure says
which rank failed and shows the end of its stderr. No process outlives the call.

A rank's result is final once every rank has returned (a barrier), so it is written then, before the
process group is torn down: a rank that dies in teardown (gloo's threads can abort a process as it
exits) still delivers it. A rank killed by a signal before it had a result (SIGABRT, SIGSEGV: a
native crash, which gloo can cause at random) gets the whole world run once more; a crash that
happens again is reported, so a function that always crashes still fails, with the same message.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from memfit.rank_server import ServerGone, server_for


class DistributedFailure(RuntimeError):
    """A rank crashed, hung past the time limit, or returned nothing."""


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, chars: int = 2000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-chars:].strip()


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the rank and anything it started
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()


class _ForkedRank:
    """A rank forked from this process, with the slice of subprocess.Popen's interface the launcher uses."""

    def __init__(self, fn: Callable, tmpdir: Path, rank: int, spec: dict, args: dict) -> None:
        import multiprocessing
        self._proc = multiprocessing.get_context("fork").Process(
            target=_forked_worker, args=(fn, str(tmpdir), rank, spec, args), daemon=False)
        self._proc.start()
        self.pid = self._proc.pid

    def poll(self):
        return self._proc.exitcode

    def wait(self):
        self._proc.join()
        return self._proc.exitcode


def _forked_worker(fn, tmpdir: str, rank: int, spec: dict, args: dict) -> None:
    os.setsid()  # its own session, so _kill_all reaches anything it starts
    with open(Path(tmpdir) / f"rank{rank}.err", "w") as err:
        os.dup2(err.fileno(), 1)
        os.dup2(err.fileno(), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    import torch
    # The parent's OpenMP thread pool did not survive the fork, and libgomp hangs if a child enters a
    # parallel region with it: one intra-op thread per rank (DataLoader workers do the same).
    torch.set_num_threads(1)
    from memfit.dist_rank import run_rank
    run_rank(fn, Path(tmpdir), rank, spec, args)


def run_ranks(target: str | Callable, world_size: int, *, backend: str = "gloo", args: dict | None = None,
              timeout_s: float = 120.0, env: dict | None = None, preload: Sequence[str] = ()) -> list[Any]:
    """Run `target` on `world_size` ranks; return each rank's result, in rank order.

    preload: modules the rank server imports once, before it forks the ranks, so that they start with them imported
    (modules whose import runs nothing: no tensor, no thread pool, no CUDA); memfit.zero names itself. Ignored
    where no server forks the ranks."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    forked = callable(target)
    if forked and backend != "gloo":
        raise ValueError("a function object runs in forked ranks, which only gloo supports; "
                         "name it as \"module:function\" to run it on NCCL")
    if backend == "nccl":
        import torch
        if torch.cuda.device_count() < world_size:
            raise ValueError(f"nccl with {world_size} ranks needs {world_size} GPUs; "
                             f"this machine has {torch.cuda.device_count()}")
    crashed = False
    for attempt in range(4):
        try:
            return _launch(target, world_size, backend, args, timeout_s, env, preload)
        except _PortTaken:
            if attempt == 3:
                raise  # four ports in a row taken between free_port and the bind: the machine's ports are scarce
        except _NativeCrash as crash:
            if crashed:
                raise DistributedFailure(f"{crash} (It crashed the same way when run a second time.)") from None
            crashed = True  # once more, all ranks fresh: a second crash is the function's own


class _NativeCrash(DistributedFailure):
    """A rank was killed by a signal before it had a result."""


class _PortTaken(DistributedFailure):
    """Another process bound the rendezvous port between free_port() and rank 0's bind (the rendezvous failed
    before any of the function ran): the launch is repeated on a fresh port."""


def _launch(target: str | Callable, world_size: int, backend: str, args: dict | None, timeout_s: float,
            env: dict | None, preload: Sequence[str] = ()) -> list[Any]:
    forked = callable(target)
    name = getattr(target, "__qualname__", repr(target)) if forked else target
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="memfit-dist-") as tmp:
        tmpdir = Path(tmp)
        spec = dict(target=None if forked else target, world_size=world_size, backend=backend,
                    args={} if forked else (args or {}), port=port)
        (tmpdir / "spec.json").write_text(json.dumps(spec))
        root = str(Path(__file__).resolve().parent.parent)
        child_env = dict(os.environ, **(env or {}))
        child_env["PYTHONPATH"] = root + os.pathsep + child_env.get("PYTHONPATH", "")
        results = [tmpdir / f"rank{rank}.json" for rank in range(world_size)]
        procs = []
        server = None if forked or backend != "gloo" else server_for(child_env)
        try:
            for rank in range(world_size):
                if forked:
                    procs.append(_ForkedRank(target, tmpdir, rank, spec, args or {}))
                    continue
                if server is not None:
                    try:
                        procs.append(server.start(str(tmpdir), rank, child_env, os.getcwd(), preload))
                        continue
                    except ServerGone:
                        server = None  # this rank and the rest as fresh interpreters
                with open(tmpdir / f"rank{rank}.err", "w") as err:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "memfit.dist", str(tmpdir), str(rank)], env=child_env,
                        stdout=err, stderr=subprocess.STDOUT, start_new_session=True))
            deadline = time.monotonic() + timeout_s

            def failures() -> tuple[list, list[int]]:  # a rank that exits badly after its result is done
                codes = [p.poll() for p in procs]
                return codes, [r for r, c in enumerate(codes) if c not in (None, 0) and not results[r].exists()]

            while True:
                codes, failed = failures()
                if failed:
                    time.sleep(0.5)  # let a peer's own error land too: the first failure is often not the cause
                    codes, failed = failures()
                    _kill_all(procs)
                    report = "\n".join(f"--- rank {r} (exit status {codes[r]}):\n{_tail(tmpdir / f'rank{r}.err')}"
                                       for r in failed)
                    kind = (_NativeCrash if any(codes[r] < 0 for r in failed) else
                            _PortTaken if "EADDRINUSE" in report else DistributedFailure)
                    raise kind(f"{name}: rank(s) {failed} of {world_size} exited with an error; "
                               f"the others were stopped.\n{report}")
                if all(c is not None for c in codes):
                    break
                if time.monotonic() > deadline:
                    waiting = [r for r, c in enumerate(codes) if c is None]
                    if all(results[r].exists() for r in waiting):
                        break  # stuck in teardown after delivering: the results stand
                    _kill_all(procs)
                    raise DistributedFailure(f"{name}: rank(s) {waiting} of {world_size} still running after "
                                             f"{timeout_s:.0f} s (a hang, or a collective some rank never joined); "
                                             f"all ranks were stopped. Last output of rank {waiting[0]}:\n"
                                             f"{_tail(tmpdir / f'rank{waiting[0]}.err')}")
                time.sleep(0.05)
        finally:
            _kill_all(procs)
        for rank, out in enumerate(results):
            if not out.exists():
                raise DistributedFailure(f"{name}: rank {rank} exited without a result")
        return [json.loads(out.read_text()) for out in results]


def importable_name(obj) -> str | None:
    """A name a fresh interpreter can resolve to obj ("pkg.mod:Name", or "notebook.ipynb::Name" for code the
    course's loader ran from a notebook), or None (defined in an interactive session, or inside a function)."""
    qualname = getattr(obj, "__qualname__", "")
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    if not qualname or "<locals>" in qualname or module is None:
        return None
    path = getattr(module, "__file__", None) or ""
    if path.endswith(".ipynb"):
        return f"{path}::{qualname}"
    if module.__name__ == "__main__":
        return None
    return f"{module.__name__}:{qualname}"


def interactive_definitions() -> str | None:
    """In a Jupyter kernel: the imports, functions and classes of every cell run so far, in the order they
    ran (a later definition replaces an earlier one), as source a fresh process can run. None elsewhere."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None:
        return None
    import ast
    kinds = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    chunks = []
    for cell in shell.user_ns.get("In", [])[1:]:
        try:
            tree = ast.parse(cell)
        except SyntaxError:
            continue
        keep = [node for node in tree.body if isinstance(node, kinds)]
        if keep:
            chunks.append(ast.unparse(ast.Module(body=keep, type_ignores=[])))
    return "\n\n".join(chunks)


def demo_all_reduce(rank: int, world_size: int) -> dict:
    """Each rank contributes rank + 1; all receive the sum."""
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return {"rank": rank, "sum": t.item()}


if __name__ == "__main__":
    from memfit.dist_rank import worker
    worker(sys.argv[1], int(sys.argv[2]))
    # The result is written and the process group gone. Skip the interpreter's teardown, where threads
    # of the communication libraries can abort the process ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
