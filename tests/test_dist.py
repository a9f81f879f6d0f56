"""The torch.distributed launcher of the course (memfit.dist): results in rank order, and a crash or a
hang fails within the time limit, naming the rank, with no process left behind."""
import time
from pathlib import Path

import pytest

from memfit.dist import DistributedFailure, free_port, run_ranks


def rank_processes() -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"memfit.dist" in args:
            found.append(cmdline.parent.name)
    return found


def test_all_reduce_on_two_gloo_ranks():
    assert run_ranks("memfit.dist:demo_all_reduce", 2) == [{"rank": 0, "sum": 3.0}, {"rank": 1, "sum": 3.0}]
    assert run_ranks("tests.dist_targets:returns_args", 3, args={"scale": 5}) == [
        {"rank": r, "value": 5 * r} for r in range(3)]


def test_a_crashing_rank_fails_fast_and_names_itself():
    start = time.monotonic()
    with pytest.raises(DistributedFailure, match=r"(?s)rank\(s\) \[.*1\] of 2 exited.*rank 1 fails on purpose"):
        run_ranks("tests.dist_targets:crash_on_rank_1", 2, timeout_s=60)
    assert time.monotonic() - start < 45
    assert not rank_processes()


def test_a_hanging_rank_is_stopped_at_the_time_limit():
    with pytest.raises(DistributedFailure, match=r"rank\(s\) \[0, 1\] of 2 still running after 8 s"):
        run_ranks("tests.dist_targets:hang_on_rank_1", 2, timeout_s=8)
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
