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
