"""A process that has imported torch, Triton and the grader once, and forks each grading child from itself.

On a CPU machine a child spends about 3 s importing torch, Triton, matplotlib and the course before the first
notebook cell runs; a class of 100 students has 800 notebooks. A fork of a process that already imported them
starts in milliseconds. Each forked child is what `python -m autograder.child` would be: its own session, the
rlimits of autograder.sandbox, its output in the log file, its signed results on the pipe it was given, the
guards installed after the fork. The server runs inside the namespaces (autograder.sandbox.Namespaces), so the
children it forks have loopback only and the read-only view of the course, as a fresh child would.

Only on machines without a GPU: a process that forks must not have touched CUDA, and on a GPU machine each child
picks its GPU through CUDA_VISIBLE_DEVICES before CUDA starts. The server never runs torch code (OpenMP's thread
pool must not exist before a fork).

    parent                                       server (python -m autograder.forkserver FD)
    spawn(): {argv, env, cwd, limits, key}  -->  fork; the child: setsid, rlimits, log on 1 and 2, main(argv)
             + the log's and the pipe's fds
             <--  {"pid": pid}
    poll()/wait(): <--  {"pid": pid, "code": exit status, negative for a signal}   (after the child ends)
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from autograder import sandbox
from course.processes import kill_tree
from memfit.rank_server import MAX_MESSAGE, fork_and_run, receive


class ForkedChild:
    """A child the server forked, with the part of subprocess.Popen's interface the runner uses."""

    def __init__(self, server: "ForkServer", pid: int):
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server._receive_exit(self, block=False)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self.server._receive_exit(self, block=True)
        return self.returncode


class ForkServerError(OSError):
    """The server is gone (killed, crashed): the runner starts another."""


class ForkServer:
    """The parent's handle on one server; one per worker, which forks one child at a time."""

    def __init__(self, env: dict[str, str], namespaces_prefix: tuple[str, ...] = ()):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [*namespaces_prefix, sys.executable, "-m", "autograder.forkserver", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)  # Ctrl-C reaches the runner only, as for children
        theirs.close()
        if self._message(timeout=120).get("ready") is not True:
            raise ForkServerError("the fork server did not start")

    def _message(self, timeout: float | None) -> dict:
        return receive(self.sock, timeout, ForkServerError, "the fork server")

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, limits: sandbox.Limits, address_space_limit: bool,
              key: bytes, log_fd: int, result_fd: int) -> ForkedChild:
        request = dict(argv=argv, env=env, cwd=cwd, key=key.hex(), address_space_limit=address_space_limit,
                       limits=dict(memory_bytes=limits.memory_bytes, cpu_seconds=limits.cpu_seconds,
                                   gpu_fraction=limits.gpu_fraction, threads=limits.threads))
        try:
            socket.send_fds(self.sock, [json.dumps(request).encode()], [log_fd, result_fd])
        except OSError as exc:
            raise ForkServerError(f"the fork server is gone: {exc}") from exc
        reply = self._message(timeout=60)
        if "pid" not in reply:
            raise ForkServerError("the fork server did not fork")
        return ForkedChild(self, reply["pid"])

    def _receive_exit(self, child: ForkedChild, block: bool) -> None:
        try:
            reply = self._message(timeout=None if block else 0)
        except ForkServerError:  # the server died with the child: its status is lost, call it killed
            child.returncode = -9
            return
        if reply.get("pid") == child.pid and "code" in reply:
            child.returncode = reply["code"]

    def close(self) -> None:
        kill_tree(self.proc.pid)
        self.proc.wait()
        self.sock.close()


# ================================================================================= the server's side

def _preload() -> None:
    """What every grading child imports before the notebook: all of it, once, here."""
    import importlib
    os.environ.setdefault("MPLBACKEND", "Agg")
    import autograder.child  # noqa: F401  (sets MEMFIT_GRADING, imports memfit and decides TRITON_INTERPRET)
    import matplotlib.pyplot  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401
    import course.notebook_loader  # noqa: F401
    import autograder.checks.references  # noqa: F401
    import memfit.meter, memfit.training  # noqa: F401,E401
    from pathlib import Path
    for path in sorted((Path(__file__).parent / "checks").glob("*.py")):
        importlib.import_module(f"autograder.checks.{path.stem}")
    from autograder import sandbox as guards
    guards.learn_runtime_state()  # once here, not in every child (it parses the grader's sources)


def _child(request: dict, log_fd: int, result_fd: int) -> int:
    """In the forked process: become what `python -m autograder.child` would be, and run it."""
    limits = sandbox.Limits(**request["limits"])
    sandbox.preexec(limits, request["address_space_limit"])()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    from autograder import child
    return child.main([*request["argv"], str(result_fd)], key=bytes.fromhex(request["key"]))


def serve(sock: socket.socket) -> None:
    _preload()
    sock.send(json.dumps({"ready": True}).encode())
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
        except OSError:
            return
        if not data:
            return
        request = json.loads(data)
        log_fd, result_fd = fds

        def child() -> int:
            sock.close()  # the child's copy: only the server answers the runner
            return _child(request, log_fd, result_fd)
        pid = fork_and_run(child)
        os.close(log_fd)
        os.close(result_fd)
        sock.send(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        sock.send(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
