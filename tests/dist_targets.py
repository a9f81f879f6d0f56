"""Functions the launcher tests run on several ranks (imported by the rank processes)."""
import time

import torch
import torch.distributed as dist


def crash_on_rank_1(rank, world_size):
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    t = torch.ones(1)
    dist.all_reduce(t)  # rank 0 waits here for a rank that is gone
    return {}


def hang_on_rank_1(rank, world_size):
    if rank == 1:
        time.sleep(3600)
    return {"rank": rank}


def returns_args(rank, world_size, scale):
    return {"rank": rank, "value": rank * scale}


def nccl_all_reduce(rank, world_size):
    t = torch.tensor([float(rank + 1)], device="cuda")
    dist.all_reduce(t)
    return {"rank": rank, "sum": t.item(), "device": torch.cuda.current_device()}


def abort_once_on_rank_1(rank, world_size, marker):
    """A native crash that happens once (as gloo's do, at random): the second run succeeds."""
    import os
    if rank == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        os.abort()
    return {"rank": rank}


def abort_on_rank_1(rank, world_size):
    """A native crash that happens every time: the function's own."""
    import os
    if rank == 1:
        os.abort()
    return {"rank": rank}


def abort_in_teardown_on_rank_1(rank, world_size):
    """Rank 1 returns, then dies as the process group is torn down (SIGABRT)."""
    import os
    if rank == 1:
        dist.destroy_process_group = lambda *args, **kwargs: os.abort()
    return {"rank": rank}
