"""Known-wrong (and known-right alternative) implementations of lesson 03's exercises."""
import math
from fractions import Fraction

import torch
import torch.nn.functional as F

import memfit.from_lessons.zero as ref


# -------------------------------------------------------------------------------- shard_bounds
def shard_bounds_floor(numel, world_size, rank):  # floor division: the tail of the vector belongs to nobody
    size = numel // world_size
    return rank * size, (rank + 1) * size


def shard_bounds_off_by_one(numel, world_size, rank):  # a shard boundary off by one
    start, stop = ref.shard_bounds(numel, world_size, rank)
    return start, stop - 1 if rank == world_size - 1 else stop


def shard_bounds_with_math(numel, world_size, rank):  # right: math.ceil of an exact fraction (of a float it is not
    if world_size < 1 or not 0 <= rank < world_size or numel < 0:  # exact above 2**53, which the check tries)
        raise ValueError("bad arguments")
    size = math.ceil(Fraction(numel, world_size))
    return rank * size, rank * size + size


# ----------------------------------------------------------------------------------- ZeroAdamW
class ZeroSumsWithoutDividing(ref.ZeroAdamW):  # the reduced gradient is the sum, not the mean
    def step(self, grad):
        super().step(grad * self.comm.world_size)


class ZeroStage1AllReduces(ref.ZeroAdamW):  # ZeRO-1 by all-reduce: right weights, 1.5x the traffic
    def step(self, grad):
        if self.stage != 1:
            return super().step(grad)
        self.grads[:self.numel].copy_(grad.reshape(-1))
        self.comm.all_reduce(self.grads)
        self.master.grad = self.grads[self.lo:self.hi].div(self.comm.world_size).float()
        self.optimizer.step()
        self.master.grad = None
        if self.mixed:
            self.params[self.lo:self.hi].copy_(self.master)
        self.comm.all_gather(self.params, self.params[self.lo:self.hi].clone())


class ZeroStage2KeepsFullGradient(ref.ZeroAdamW):  # ZeRO-2 that keeps the padded local gradient alive
    def step(self, grad):
        if self.stage == 2:
            self.last_gradient = F.pad(grad.reshape(-1), (0, self.padded - self.numel))
        super().step(grad)


class ZeroGatherIgnoresOut(ref.ZeroAdamW):  # stage 3 gathers into a new buffer even when given one
    def gather_params(self, out=None):
        return super().gather_params(None)


class ZeroForgetsMasterInBuffers(ref.ZeroAdamW):  # the fp32 master copy left out of the accounting
    def buffers(self):
        out = super().buffers()
        out["optimizer"] = [t for t in out["optimizer"] if t is not self.master]
        return out


class ZeroAcceptsAnyStage(ref.ZeroAdamW):
    def __init__(self, params, comm, stage, **kwargs):
        super().__init__(params, comm, min(stage, 3), **kwargs)


class ZeroForeachAdamW(ref.ZeroAdamW):  # right for zero_memory: the multi-tensor AdamW (its last bits may differ)
    def __init__(self, params, comm, stage, **kwargs):
        super().__init__(params, comm, stage, **kwargs)
        group = self.optimizer.param_groups[0]
        self.optimizer = torch.optim.AdamW([self.master], lr=group["lr"], betas=group["betas"], eps=group["eps"],
                                           weight_decay=group["weight_decay"], foreach=True)


# --------------------------------------------------------------------------- zero_bytes_per_rank
def zero_bytes_unpadded(stage, numel, world_size, param_bytes=2, grad_bytes=2, optimizer_bytes=12):
    shard = numel / world_size
    out = {"params": param_bytes * (shard if stage == 3 else numel), "grads": grad_bytes * (shard if stage >= 2 else numel),
           "optimizer": optimizer_bytes * (shard if stage >= 1 else numel)}
    out["total"] = sum(out.values())
    return out


def zero_bytes_stage2_shards_params(stage, numel, world_size, param_bytes=2, grad_bytes=2, optimizer_bytes=12):
    return ref.zero_bytes_per_rank(3 if stage == 2 else stage, numel, world_size, param_bytes, grad_bytes,
                                   optimizer_bytes)


# --------------------------------------------------------------------------- comm_bytes_per_rank
def comm_bytes_stage3_gathers_once(stage, numel, world_size, param_bytes=2, grad_bytes=2):
    return ref.comm_bytes_per_rank(2 if stage == 3 else stage, numel, world_size, param_bytes, grad_bytes)


def comm_bytes_whole_vectors(stage, numel, world_size, param_bytes=2, grad_bytes=2):  # 2Ψ, not 2(N-1)/N·Ψ
    padded = world_size * math.ceil(numel / world_size)
    return {0: 2 * padded * grad_bytes, 1: padded * (grad_bytes + param_bytes),
            2: padded * (grad_bytes + param_bytes), 3: padded * (grad_bytes + 2 * param_bytes)}[stage]


# ---------------------------------------------------------------------- deepspeed_zero3_estimate
def estimate_16_bytes_without_offload(total, largest, gpus_per_node=1, nodes=1, offload_optimizer=True,
                                      offload_params=True, zero_init=True, buffer_factor=1.5):
    cpu, gpu = ref.deepspeed_zero3_estimate(total, largest, gpus_per_node, nodes, offload_optimizer, offload_params,
                                            zero_init, buffer_factor)
    if not offload_optimizer:
        gpu -= int(2 * total / (gpus_per_node * nodes))
    return cpu, gpu


def estimate_without_buffer_factor(total, largest, gpus_per_node=1, nodes=1, offload_optimizer=True,
                                   offload_params=True, zero_init=True, buffer_factor=1.5):
    return ref.deepspeed_zero3_estimate(total, largest, gpus_per_node, nodes, offload_optimizer, offload_params,
                                        zero_init, 1.0)


# ----------------------------------------------------------------------------- prefetch_timeline
def timeline_without_memory_cap(compute_ms, gather_ms, unit_bytes, prefetch=1):  # gathers never wait for room
    return ref.prefetch_timeline(compute_ms, gather_ms, unit_bytes, prefetch=len(compute_ms))


def timeline_peak_from_depth(compute_ms, gather_ms, unit_bytes, prefetch=1):  # peak = (k+1) biggest units
    out = ref.prefetch_timeline(compute_ms, gather_ms, unit_bytes, prefetch)
    out["peak_bytes"] = sum(sorted(unit_bytes, reverse=True)[:prefetch + 1])
    return out
