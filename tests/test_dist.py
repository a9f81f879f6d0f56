"""The torch.distributed launcher of the course (memfit.dist): results in rank order, and a crash or a
hang fails within the time limit, naming the rank, with no process left behind."""
import os
import time
from pathlib import Path

import pytest

from memfit.dist import DistributedFailure, free_port, run_ranks


def _ours(pid: str) -> bool:
    """Started under this pytest worker (its environment says so, orphaned or not): the ranks another worker of
    make test runs at the same time are not this test's to count."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return True
    try:
        return f"PYTEST_XDIST_WORKER={worker}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _command(pid: str) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def _parent(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return ""


def rank_processes() -> list[str]:
    """Ranks still alive: fresh interpreters (python -m memfit.dist) and forks of the rank server (children of a
    python -m memfit.rank_server; the server itself stays, for the next world)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        pid = proc.name
        args = _command(pid)
        rank = b"memfit.dist" in args or (b"memfit.rank_server" in args and
                                          b"memfit.rank_server" in _command(_parent(pid)))
        if rank and _ours(pid):
            found.append(pid)
    return found


def test_all_reduce_on_two_gloo_ranks():
    assert run_ranks("memfit.dist:demo_all_reduce", 2) == [{"rank": 0, "sum": 3.0}, {"rank": 1, "sum": 3.0}]
    assert run_ranks("tests.dist_targets:returns_args", 3, args={"scale": 5}) == [
        {"rank": r, "value": 5 * r} for r in range(3)]


def test_a_port_taken_before_the_rendezvous_starts_the_world_again_on_another(monkeypatch):
    """free_port() closes its socket before rank 0 binds: another process (a parallel test) can take the port in
    between. The launcher starts the world again on a fresh port; the function had not run."""
    import socket
    import memfit.dist
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])
    monkeypatch.setattr(memfit.dist, "free_port", lambda: next(ports, None) or free_port())
    try:
        assert run_ranks("memfit.dist:demo_all_reduce", 2) == [{"rank": 0, "sum": 3.0}, {"rank": 1, "sum": 3.0}]
    finally:
        taken.close()


def test_a_crashing_rank_fails_fast_and_names_itself():
    # "exited", not "still running after 600 s": the crash is seen when it happens, not at the time limit (a check
    # of the path taken, not of the machine's speed)
    with pytest.raises(DistributedFailure, match=r"(?s)rank\(s\) \[.*1\] of 2 exited.*rank 1 fails on purpose"):
        run_ranks("tests.dist_targets:crash_on_rank_1", 2, timeout_s=600)
    assert not rank_processes()


def test_a_hanging_rank_is_stopped_at_the_time_limit():
    with pytest.raises(DistributedFailure, match=r"rank\(s\) \[0, 1\] of 2 still running after 8 s"):
        run_ranks("tests.dist_targets:hang_on_rank_1", 2, timeout_s=8)
    assert not rank_processes()


def test_a_rank_that_dies_in_teardown_still_delivers_its_result():
    assert run_ranks("tests.dist_targets:abort_in_teardown_on_rank_1", 2, timeout_s=60) == [
        {"rank": 0}, {"rank": 1}]
    assert not rank_processes()


def test_a_native_crash_gets_one_more_run(tmp_path):
    """A rank's SIGABRT before its result reruns the world once: a random crash costs nothing, a crash
    that happens every time still fails, saying so."""
    marker = tmp_path / "crashed-once"
    assert run_ranks("tests.dist_targets:abort_once_on_rank_1", 2, args={"marker": str(marker)},
                     timeout_s=60) == [{"rank": 0}, {"rank": 1}]
    assert marker.exists()
    with pytest.raises(DistributedFailure, match=r"(?s)rank\(s\) \[.*1\] of 2 exited.*exit status -6.*"
                                                 r"crashed the same way when run a second time"):
        run_ranks("tests.dist_targets:abort_on_rank_1", 2, timeout_s=60)
    assert not rank_processes()


def test_bad_arguments():
    with pytest.raises(ValueError, match="world_size"):
        run_ranks("memfit.dist:demo_all_reduce", 0)
    with pytest.raises(DistributedFailure, match="no_such_function"):
        run_ranks("memfit.dist:no_such_function", 1, timeout_s=60)


def test_all_reduce_on_two_nccl_ranks():
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("skipped: needs 2 GPUs")
    assert run_ranks("tests.dist_targets:nccl_all_reduce", 2, backend="nccl") == [
        {"rank": 0, "sum": 3.0, "device": 0}, {"rank": 1, "sum": 3.0, "device": 1}]


def child_processes() -> list[str]:
    """Live processes whose parent is this test process (forked ranks keep their parent's command line), but for
    the rank server, which stays for the next world."""
    import os
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and \
                b"memfit.rank_server" not in _command(stat.parent.name):
            found.append(stat.parent.name)
    return found


def test_function_objects_run_in_forked_ranks():
    scale = 7  # a closure over this test's state: only a fork can carry it to the ranks

    def local_rank_fn(rank, world_size, offset):
        import torch
        import torch.distributed as dist
        t = torch.tensor([float(rank * scale + offset)])
        dist.all_reduce(t)
        return {"rank": rank, "sum": t.item()}

    assert run_ranks(local_rank_fn, 2, args={"offset": 1}) == [{"rank": 0, "sum": 9.0}, {"rank": 1, "sum": 9.0}]
    assert not child_processes()


def test_forked_ranks_crash_and_hang_like_spawned_ones():
    def crash(rank, world_size):
        if rank == 1:
            raise RuntimeError("forked rank 1 fails on purpose")
        import torch
        import torch.distributed as dist
        dist.all_reduce(torch.ones(1))
        return {}

    def hang(rank, world_size):
        time.sleep(3600)

    with pytest.raises(DistributedFailure, match=r"(?s)rank\(s\) \[.*1\] of 2 exited.*forked rank 1 fails on purpose"):
        run_ranks(crash, 2, timeout_s=60)
    with pytest.raises(DistributedFailure, match=r"still running after 5 s"):
        run_ranks(hang, 2, timeout_s=5)
    assert not child_processes()
    with pytest.raises(ValueError, match="only gloo"):
        run_ranks(hang, 2, backend="nccl")


def test_zero_under_torchrun():
    """`make zero-torchrun`'s command: torchrun starts the ranks, the reference ZeroAdamW trains on them."""
    import json
    import subprocess
    import sys

    from course import ROOT, course_env
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "memfit.zero", "--stage", "2", "--device", "cpu",
                           "--optimizer", "memfit.from_lessons.zero:ZeroAdamW"], cwd=ROOT, env=course_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = sorted((json.loads(line.split(": ", 1)[1]) for line in proc.stdout.splitlines()
                    if line.startswith("rank ")), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["bitwise_equal"] and all(r["at_rest"] == sum(r["buffers"].values()) for r in ranks)


def test_a_class_from_a_jupyter_cell_reaches_spawned_ranks():
    """In a kernel the learner's class is neither importable nor safely forkable (on a GPU machine, after a
    backward pass): the ranks get the notebook's definitions as source."""
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell
    from memfit.zero import run_distributed
    shell = InteractiveShell.instance()
    try:
        for cell in ("import torch\nfrom memfit.from_lessons.zero import ZeroAdamW as _Reference",
                     "x = 1  # not a definition: not replayed",
                     "class MyZero(_Reference):\n    pass"):
            assert shell.run_cell(cell, store_history=True).success
        ranks = run_distributed(shell.user_ns["MyZero"], 2, 1, opt_args=dict(lr=1e-2, eps=1e-3, weight_decay=0.1))
    finally:
        InteractiveShell.clear_instance()
    assert ranks[0]["bitwise_equal"] and ranks[0]["at_rest"] == ranks[1]["at_rest"]
