"""A process that has imported torch once and forks gloo ranks from itself (memfit.dist's launcher uses it).

A rank started as a fresh interpreter spends one to two seconds of CPU importing torch before its function runs;
lesson 03's checks start a world of ranks several times. Forked from this server, which imported torch and the
course and has run nothing since (no tensor, no thread pool, no CUDA), a rank starts in milliseconds and is what
`python -m memfit.dist TMPDIR RANK` would be: its own session, its output in rankN.err, the launcher's
environment and folder. Only on machines without a GPU (a process that forks must not have touched CUDA).

    launcher                                     server (python -m memfit.rank_server FD)
    start(): {tmpdir, rank, env, cwd,   -->      import the preload modules it has not yet; fork; the rank: setsid,
              preload}                           rankN.err on 1 and 2, env, memfit.dist_rank.worker
                                        <--      {"pid": pid}
    poll()/wait():                      <--      {"pid": pid, "code": exit status, negative for a signal}

The server imports torch and memfit.dist_rank as it starts, and whatever modules a launcher names in `preload`
(memfit.zero names itself for its ranks) once, before it forks: it knows no module above it by name, so the
library's imports stay one-way (memfit.zero -> memfit.dist -> memfit.rank_server, never back).
"""
from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import traceback
from typing import Callable, Sequence

MAX_MESSAGE = 1 << 20


def receive(sock: socket.socket, timeout: float | None, gone: type[Exception], who: str) -> dict:
    """One JSON message from a server's end of a SOCK_SEQPACKET pair (this module's and autograder.forkserver's);
    {} when none came within `timeout` seconds; `gone` raised when the server has closed its end or died."""
    sock.settimeout(timeout)
    try:
        data = sock.recv(MAX_MESSAGE)
    except (socket.timeout, BlockingIOError):
        return {}
    except OSError as exc:
        raise gone(f"{who} is gone: {exc}") from exc
    if not data:
        raise gone(f"{who} is gone")
    return json.loads(data)


class ServerGone(OSError):
    """The server died or never started: the launcher starts ranks as fresh interpreters instead."""


class ServedRank:
    """A rank the server forked, with the part of subprocess.Popen's interface the launcher uses."""

    def __init__(self, server: RankServer, pid: int) -> None:
        self.server, self.pid = server, pid

    def poll(self) -> int | None:
        self.server.receive(block=False)
        return self.server.exits.get(self.pid)

    def wait(self) -> int:
        while self.pid not in self.server.exits:
            self.server.receive(block=True)
        return self.server.exits[self.pid]


class RankServer:
    """The launcher's handle on one server process; the ranks of one world or of many."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.exits: dict[int, int] = {}  # pid -> exit status, as the server reports them
        self._pids: list[int] = []  # every rank it forked
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, "-m", "memfit.rank_server", str(theirs.fileno())],
                                     pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        if self._message(timeout=120).get("ready") is not True:
            self.close()
            raise ServerGone("the rank server did not start")

    def _message(self, timeout: float | None) -> dict:
        return receive(self.sock, timeout, ServerGone, "the rank server")

    def receive(self, block: bool) -> None:
        """Record the exit statuses the server sent; a server that died takes its ranks with it (-9)."""
        try:
            message = self._message(timeout=0.1 if block else 0)
            while message:
                if "code" in message:
                    self.exits[message["pid"]] = message["code"]
                message = self._message(timeout=0)
        except ServerGone:
            for pid in self._pids:
                self.exits.setdefault(pid, -9)

    def start(self, tmpdir: str, rank: int, env: dict[str, str], cwd: str, preload: Sequence[str] = ()) -> ServedRank:
        """Fork rank `rank` from the server; `preload`: modules the server imports first (once, in itself), so
        that this rank and the later ones find them imported."""
        try:
            self.sock.send(json.dumps(dict(tmpdir=tmpdir, rank=rank, env=env, cwd=cwd,
                                           preload=list(preload))).encode())
        except OSError as exc:
            raise ServerGone(f"the rank server is gone: {exc}") from exc
        while True:  # exit statuses of earlier ranks may come first
            message = self._message(timeout=60)
            if not message:
                raise ServerGone("the rank server did not fork")
            if "code" in message:
                self.exits[message["pid"]] = message["code"]
                continue
            self._pids.append(message["pid"])
            return ServedRank(self, message["pid"])

    def close(self) -> None:
        self.sock.close()
        self.proc.kill()
        self.proc.wait()


_server: RankServer | None = None


def server_for(env: dict[str, str]) -> RankServer | None:
    """This process's server for ranks of environment `env` (one started anew when the environment changed), or
    None on a machine with a GPU, where MEMFIT_RANK_SERVER=0, or when it cannot start."""
    global _server
    from memfit.runtime import HAS_GPU
    if HAS_GPU or os.environ.get("MEMFIT_RANK_SERVER") == "0":
        return None
    key = {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"}  # pytest changes it for every test
    if _server is not None and (_server.env != key or _server.proc.poll() is not None):
        _server.close()
        _server = None
    if _server is None:
        try:
            _server = RankServer(key)
        except (OSError, ServerGone):
            return None
    return _server


# ================================================================================= the server's side

def _rank(request: dict) -> int:
    """In the forked process: become what `python -m memfit.dist TMPDIR RANK` would be, and run the rank."""
    os.setsid()  # its own session: the launcher stops the rank and anything it starts with one killpg
    err = os.open(os.path.join(request["tmpdir"], f"rank{request['rank']}.err"),
                  os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(err, 1)
    os.dup2(err, 2)
    os.close(err)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    from memfit.dist_rank import worker
    worker(request["tmpdir"], request["rank"])
    return 0


def fork_and_run(child: Callable[[], int]) -> int:
    """Fork; the child runs child() and exits with what it returns, as `python -m` would end (SystemExit's code;
    status 1 and the traceback on stderr for any other exception), without the interpreter's teardown, where
    gloo's threads can abort a process. Returns the child's pid (in the server; the child never returns)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        code = child()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def preload(modules: Sequence[str]) -> None:
    """Import each of `modules` not yet imported, in the server, before it forks: a module whose import runs
    nothing (no tensor, no thread pool, no CUDA), named by the launcher's caller. One that fails to import is left
    to the rank, which imports it again and reports the error where its launcher reads it."""
    import importlib
    for name in modules:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001
                pass


def serve(sock: socket.socket) -> None:
    import torch  # noqa: F401  (what every rank imports; nothing runs: a fork must not copy a thread pool)
    import torch.distributed  # noqa: F401
    import memfit.dist_rank  # noqa: F401
    sock.send(json.dumps({"ready": True}).encode())
    running: set[int] = set()
    while True:
        readable, _, _ = select.select([sock], [], [], 0.05 if running else None)
        if readable:
            data = sock.recv(MAX_MESSAGE)
            if not data:
                return  # the launching process ended
            request = json.loads(data)
            preload(request.get("preload", ()))

            def rank() -> int:
                sock.close()  # the rank's copy: only the server answers the launcher
                return _rank(request)
            pid = fork_and_run(rank)
            running.add(pid)
            sock.send(json.dumps({"pid": pid}).encode())
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            running.discard(pid)
            sock.send(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
