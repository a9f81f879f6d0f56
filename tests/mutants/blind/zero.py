"""Blind set for lesson 03_zero: written from the exercise text alone (lessons/03_zero.ipynb)."""
import memfit  # noqa: F401  (first: it decides TRITON_INTERPRET before triton is imported)

import math

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


# =============================================================================================== helpers

def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ======================================================================================= shard_bounds

def shard_bounds_ceil_div(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """RIGHT: the obvious one, integer ceil division."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    shard = -(-numel // world_size)
    return rank * shard, (rank + 1) * shard


def shard_bounds_divmod(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """RIGHT: divmod for the rounding, validation in another order."""
    if numel < 0 or world_size < 1 or rank < 0 or rank >= world_size:
        raise ValueError("bad shard_bounds arguments")
    q, r = divmod(numel, world_size)
    shard = q + (1 if r else 0)
    start = shard * rank
    return start, start + shard


def shard_bounds_floor(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """WRONG: floor division: shards too small when numel is not a multiple of world_size."""
    if world_size < 1:
        raise ValueError("world_size")
    if not 0 <= rank < world_size:
        raise ValueError("rank")
    if numel < 0:
        raise ValueError("numel")
    shard = numel // world_size
    return rank * shard, (rank + 1) * shard


def shard_bounds_clipped_stop(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """WRONG: the last shard's stop is clipped to numel (unequal shards)."""
    if world_size < 1:
        raise ValueError("world_size")
    if not 0 <= rank < world_size:
        raise ValueError("rank")
    if numel < 0:
        raise ValueError("numel")
    shard = -(-numel // world_size)
    return min(rank * shard, numel), min((rank + 1) * shard, numel)


def shard_bounds_float_ceil(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """WRONG: math.ceil(numel / world_size) goes through a float: wrong above 2**53."""
    if world_size < 1:
        raise ValueError("world_size")
    if not 0 <= rank < world_size:
        raise ValueError("rank")
    if numel < 0:
        raise ValueError("numel")
    shard = math.ceil(numel / world_size)
    return rank * shard, (rank + 1) * shard


def shard_bounds_min_one(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """WRONG: a shard is made at least one element long: numel = 0 gives 1-element shards."""
    if world_size < 1:
        raise ValueError("world_size")
    if not 0 <= rank < world_size:
        raise ValueError("rank")
    if numel < 0:
        raise ValueError("numel")
    shard = max(1, -(-numel // world_size))
    return rank * shard, (rank + 1) * shard


def shard_bounds_rank_off_by_one(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """WRONG: rank == world_size accepted (rank > world_size tested)."""
    if world_size < 1:
        raise ValueError("world_size")
    if rank < 0 or rank > world_size:
        raise ValueError("rank")
    if numel < 0:
        raise ValueError("numel")
    shard = -(-numel // world_size)
    return rank * shard, (rank + 1) * shard


def shard_bounds_no_numel_check(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """WRONG: negative numel is not rejected."""
    if world_size < 1:
        raise ValueError("world_size")
    if not 0 <= rank < world_size:
        raise ValueError("rank")
    shard = -(-numel // world_size)
    return rank * shard, (rank + 1) * shard


def shard_bounds_zero_world(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """WRONG: world_size < 0 tested instead of < 1: world_size = 0 ends in ZeroDivisionError, not ValueError."""
    if world_size < 0:
        raise ValueError("world_size")
    if rank < 0 or (world_size and rank >= world_size):
        raise ValueError("rank")
    if numel < 0:
        raise ValueError("numel")
    shard = -(-numel // world_size)
    return rank * shard, (rank + 1) * shard


# ========================================================================================== ZeroAdamW

class ZeroAdamW_views:
    """RIGHT: fp32 master shards are views of the parameter buffer; AdamW state created eagerly."""

    def __init__(self, params: torch.Tensor, comm, stage: int, *, lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, param_dtype: torch.dtype = torch.float32):
        if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
            raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
        n, r = comm.world_size, comm.rank
        self.comm, self.stage, self.param_dtype = comm, stage, param_dtype
        self.numel = params.numel()
        self.start, self.stop = shard_bounds_ceil_div(self.numel, n, r)
        self.shard = self.stop - self.start
        self.padded = self.shard * n
        self.mixed = param_dtype != torch.float32
        device = params.device
        self.device = device
        flat = torch.zeros(self.padded, dtype=torch.float32, device=device)
        flat[:self.numel].copy_(params.reshape(-1))
        mine = flat if stage == 0 else flat[self.start:self.stop]
        if stage == 3:
            self.params = mine.to(param_dtype, copy=True)
        else:
            self.params = flat.to(param_dtype) if self.mixed else flat
        if self.mixed:
            self.master = mine.clone()
        else:
            self.master = self.params if stage in (0, 3) else self.params[self.start:self.stop]
        del flat, mine
        gsize = self.padded if stage <= 1 else self.shard
        self.grads = torch.zeros(gsize, dtype=param_dtype, device=device)
        self._make_optimizer(lr, betas, eps, weight_decay)

    def _make_optimizer(self, lr, betas, eps, weight_decay):
        self.opt = torch.optim.AdamW([self.master], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                     foreach=False)
        state = self.opt.state[self.master]
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(self.master, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(self.master, memory_format=torch.preserve_format)

    # the parts mutants override -------------------------------------------------------------------
    def _own_params(self) -> torch.Tensor:
        """The part of self.params this rank updates."""
        if self.stage in (0, 3):
            return self.params
        return self.params[self.start:self.stop]

    def _reduce(self, grad: torch.Tensor) -> torch.Tensor:
        n, g = self.comm.world_size, grad.reshape(-1)
        if self.stage == 0:
            self.grads[:self.numel].copy_(g)
            self.comm.all_reduce(self.grads)
            return self.grads.div_(n)
        if self.stage == 1:
            self.grads[:self.numel].copy_(g)
            out = torch.empty(self.shard, dtype=self.param_dtype, device=self.device)
            self.comm.reduce_scatter(out, self.grads)
            return out.div_(n)
        full = torch.zeros(self.padded, dtype=self.param_dtype, device=self.device)
        full[:self.numel].copy_(g)
        self.comm.reduce_scatter(self.grads, full)
        del full
        return self.grads.div_(n)

    def _update(self, gshard: torch.Tensor) -> None:
        self.master.grad = gshard.float() if self.mixed else gshard
        self.opt.step()
        self.master.grad = None
        if self.mixed:
            self._own_params().copy_(self.master)

    def _bring_up_to_date(self) -> None:
        if self.stage in (1, 2):
            self.comm.all_gather(self.params, self.params[self.start:self.stop].clone())

    # the interface --------------------------------------------------------------------------------
    def gather_params(self, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.stage < 3:
            if out is not None:
                out.copy_(self.params)
                return out
            return self.params
        if out is None:
            out = torch.empty(self.padded, dtype=self.param_dtype, device=self.device)
        self.comm.all_gather(out, self.params)
        return out

    def step(self, grad: torch.Tensor) -> None:
        gshard = self._reduce(grad)
        self._update(gshard)
        del gshard
        self._bring_up_to_date()

    def _optimizer_tensors(self) -> list[torch.Tensor]:
        state = self.opt.state.get(self.master, {})
        out = [state[k] for k in ("exp_avg", "exp_avg_sq") if k in state]
        if self.mixed:
            out.append(self.master)
        return out

    def buffers(self) -> dict[str, list[torch.Tensor]]:
        return {"params": [self.params], "grads": [self.grads], "optimizer": self._optimizer_tensors()}


class ZeroAdamW_lazy_separate_paths:
    """RIGHT: written independently: lazy AdamW state, a branch per stage, the gathered shard sent from the
    master (cast) instead of a clone of the parameter slice, the padded gradient built with torch.cat."""

    def __init__(self, params, comm, stage, *, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 param_dtype=torch.float32):
        if stage not in (0, 1, 2, 3):
            raise ValueError("stage must be 0-3")
        self.comm, self.stage, self.dtype = comm, stage, param_dtype
        N = comm.world_size
        self.numel = params.numel()
        self.shard = _ceil_div(self.numel, N)
        self.padded = self.shard * N
        self.lo = comm.rank * self.shard
        self.hi = self.lo + self.shard
        dev = params.device
        pad = self.padded - self.numel
        full32 = torch.cat([params.reshape(-1).float(), params.new_zeros(pad, dtype=torch.float32)])
        fp32 = param_dtype == torch.float32
        if stage == 0:
            self.params = full32 if fp32 else full32.to(param_dtype)
            self.master = self.params if fp32 else full32
        elif stage in (1, 2):
            self.params = full32 if fp32 else full32.to(param_dtype)
            self.master = self.params[self.lo:self.hi] if fp32 else full32[self.lo:self.hi].clone()
        else:
            self.master = full32[self.lo:self.hi].clone()
            self.params = self.master if fp32 else self.master.to(param_dtype)
        del full32
        self.grads = torch.zeros(self.padded if stage < 2 else self.shard, dtype=param_dtype, device=dev)
        self.fp32 = fp32
        self.opt = torch.optim.AdamW([self.master], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                     foreach=False)

    def gather_params(self, out=None):
        if self.stage != 3:
            return self.params
        if out is None:
            out = torch.empty(self.padded, dtype=self.dtype, device=self.params.device)
        self.comm.all_gather(out, self.params)
        return out

    def step(self, grad):
        N = self.comm.world_size
        g = grad.reshape(-1)
        if self.stage == 0:
            self.grads[:self.numel] = g
            self.comm.all_reduce(self.grads)
            self.grads /= N
            shard = self.grads
        elif self.stage == 1:
            self.grads[:self.numel] = g
            shard = torch.empty(self.shard, dtype=self.dtype, device=g.device)
            self.comm.reduce_scatter(shard, self.grads)
            shard /= N
        else:
            padded = torch.cat([g.to(self.dtype), g.new_zeros(self.padded - self.numel, dtype=self.dtype)])
            self.comm.reduce_scatter(self.grads, padded)
            del padded
            self.grads /= N
            shard = self.grads
        self.master.grad = shard if self.fp32 else shard.to(torch.float32)
        del shard
        self.opt.step()
        self.master.grad = None
        if self.stage == 0:
            if not self.fp32:
                self.params.copy_(self.master)
        elif self.stage in (1, 2):
            send = self.master.to(self.dtype, copy=True)
            self.comm.all_gather(self.params, send)
            del send
        else:
            if not self.fp32:
                self.params.copy_(self.master)

    def buffers(self):
        st = self.opt.state.get(self.master, {})
        opt = [st[k] for k in ("exp_avg", "exp_avg_sq") if k in st]
        if not self.fp32:
            opt.append(self.master)
        return {"params": [self.params], "grads": [self.grads], "optimizer": opt}


class ZeroAdamW_divide_before_sum(ZeroAdamW_views):
    """WRONG: each rank divides its gradient by N before the reduction (exact only when N is a power of 2)."""

    def _reduce(self, grad):
        g = grad.reshape(-1) / self.comm.world_size
        if self.stage == 0:
            self.grads[:self.numel].copy_(g)
            self.comm.all_reduce(self.grads)
            return self.grads
        if self.stage == 1:
            self.grads[:self.numel].copy_(g)
            out = torch.empty(self.shard, dtype=self.param_dtype, device=self.device)
            self.comm.reduce_scatter(out, self.grads)
            return out
        full = torch.zeros(self.padded, dtype=self.param_dtype, device=self.device)
        full[:self.numel].copy_(g)
        self.comm.reduce_scatter(self.grads, full)
        del full
        return self.grads


class ZeroAdamW_fp32_second_master(ZeroAdamW_views):
    """WRONG: an fp32 master copy is made even when param_dtype is fp32 (listed as optimizer state)."""

    def __init__(self, params, comm, stage, *, param_dtype=torch.float32, **kw):
        super().__init__(params, comm, stage, param_dtype=param_dtype, **kw)
        if not self.mixed:
            # replace the view by a separate copy, and rebuild the optimizer over it
            self.master = self._own_params().clone()
            g = self.opt.param_groups[0]
            self._make_optimizer(g["lr"], g["betas"], g["eps"], g["weight_decay"])

    def _update(self, gshard):
        self.master.grad = gshard.float().clone() if not self.mixed else gshard.float()
        self.opt.step()
        self.master.grad = None
        self._own_params().copy_(self.master)

    def _optimizer_tensors(self):
        state = self.opt.state.get(self.master, {})
        return [state["exp_avg"], state["exp_avg_sq"], self.master]


class ZeroAdamW_stage2_keeps_full_grad(ZeroAdamW_views):
    """WRONG: stage 2/3 keep the padded full gradient in an attribute (reused every step), unlisted."""

    def _reduce(self, grad):
        if self.stage < 2:
            return super()._reduce(grad)
        if not hasattr(self, "_full"):
            self._full = torch.zeros(self.padded, dtype=self.param_dtype, device=self.device)
        self._full[:self.numel].copy_(grad.reshape(-1))
        self.comm.reduce_scatter(self.grads, self._full)
        return self.grads.div_(self.comm.world_size)


class ZeroAdamW_keeps_last_grad(ZeroAdamW_views):
    """WRONG: step() stores the local gradient (self.last_grad = grad) for 'debugging': Ψ elements kept alive."""

    def step(self, grad):
        self.last_grad = grad
        super().step(grad)


class ZeroAdamW_no_copy_back_stage3(ZeroAdamW_views):
    """WRONG: with bf16/fp16, stage 3 never copies the updated fp32 master back into its parameter shard."""

    def _update(self, gshard):
        self.master.grad = gshard.float() if self.mixed else gshard
        self.opt.step()
        self.master.grad = None
        if self.mixed and self.stage != 3:
            self._own_params().copy_(self.master)


class ZeroAdamW_gather_ignores_out(ZeroAdamW_views):
    """WRONG: stage 3 gather_params always all-gathers into a new buffer, even when `out` is given."""

    def gather_params(self, out=None):
        if self.stage < 3:
            return self.params
        full = torch.empty(self.padded, dtype=self.param_dtype, device=self.device)
        self.comm.all_gather(full, self.params)
        return full


class ZeroAdamW_unpadded_gather(ZeroAdamW_views):
    """WRONG: stages 0-2 return the parameters without the padding (params[:numel]), not the padded vector."""

    def gather_params(self, out=None):
        if self.stage < 3:
            return self.params[:self.numel]
        return super().gather_params(out)


class ZeroAdamW_stage1_all_reduce(ZeroAdamW_views):
    """WRONG: stage 1 all-reduces the full gradient and slices its shard instead of reduce-scattering."""

    def _reduce(self, grad):
        if self.stage != 1:
            return super()._reduce(grad)
        self.grads[:self.numel].copy_(grad.reshape(-1))
        self.comm.all_reduce(self.grads)
        return self.grads[self.start:self.stop].div(self.comm.world_size)


class ZeroAdamW_stage3_gathers_after_step(ZeroAdamW_views):
    """WRONG: stage 3 also all-gathers the parameters after its update (into a throwaway buffer), as stages 1-2."""

    def _bring_up_to_date(self):
        if self.stage in (1, 2):
            super()._bring_up_to_date()
        elif self.stage == 3:
            full = torch.empty(self.padded, dtype=self.param_dtype, device=self.device)
            self.comm.all_gather(full, self.params)
            del full


class ZeroAdamW_no_stage_check(ZeroAdamW_views):
    """WRONG: no ValueError for a bad stage: anything >= 3 runs as stage 3 (stage 4, 7 accepted)."""

    def __init__(self, params, comm, stage, **kw):
        super().__init__(params, comm, min(max(int(stage), 0), 3), **kw)


class ZeroAdamW_garbage_grad_padding(ZeroAdamW_views):
    """WRONG: stages 2-3 build the padded gradient with torch.empty: the padding is not zero."""

    def _reduce(self, grad):
        if self.stage < 2:
            return super()._reduce(grad)
        full = torch.empty(self.padded, dtype=self.param_dtype, device=self.device)
        if self.padded > self.numel:
            full[self.numel:] = 1e3  # what an uninitialised buffer may hold
        full[:self.numel].copy_(grad.reshape(-1))
        self.comm.reduce_scatter(self.grads, full)
        del full
        return self.grads.div_(self.comm.world_size)


class ZeroAdamW_mixed_master_unlisted(ZeroAdamW_views):
    """WRONG: the fp32 master copy under bf16/fp16 is kept but not listed in buffers()['optimizer']."""

    def _optimizer_tensors(self):
        state = self.opt.state.get(self.master, {})
        return [state[k] for k in ("exp_avg", "exp_avg_sq") if k in state]


class ZeroAdamW_lists_step_count(ZeroAdamW_views):
    """WRONG: buffers() lists every tensor of AdamW's state, the scalar step count included."""

    def _optimizer_tensors(self):
        state = self.opt.state.get(self.master, {})
        out = [v for v in state.values() if torch.is_tensor(v)]
        if self.mixed:
            out.append(self.master)
        return out


class ZeroAdamW_stage0_unpadded_grads(ZeroAdamW_views):
    """WRONG: stage 0 and 1 keep an unpadded gradient buffer (Ψ elements) though the table says padded."""

    def __init__(self, params, comm, stage, **kw):
        super().__init__(params, comm, stage, **kw)
        if self.stage == 0:
            self.grads = torch.zeros(self.numel, dtype=self.param_dtype, device=self.device)

    def _reduce(self, grad):
        if self.stage != 0:
            return super()._reduce(grad)
        self.grads.copy_(grad.reshape(-1))
        self.comm.all_reduce(self.grads)
        self.grads.div_(self.comm.world_size)
        if self.padded == self.numel:
            return self.grads
        return torch.cat([self.grads, self.grads.new_zeros(self.padded - self.numel)])


class ZeroAdamW_fp32_grad_buffer(ZeroAdamW_views):
    """WRONG: the gradient buffer (full or shard) is always fp32 'for accuracy', even under bf16/fp16."""

    def __init__(self, params, comm, stage, **kw):
        super().__init__(params, comm, stage, **kw)
        self.grads = torch.zeros(self.grads.numel(), dtype=torch.float32, device=self.device)

    def _reduce(self, grad):
        n, g = self.comm.world_size, grad.reshape(-1).float()
        if self.stage <= 1:
            self.grads[:self.numel].copy_(g)
            if self.stage == 0:
                self.comm.all_reduce(self.grads)
                return self.grads.div_(n)
            out = torch.empty(self.shard, dtype=torch.float32, device=self.device)
            self.comm.reduce_scatter(out, self.grads)
            return out.div_(n)
        full = torch.zeros(self.padded, dtype=torch.float32, device=self.device)
        full[:self.numel].copy_(g)
        self.comm.reduce_scatter(self.grads, full)
        del full
        return self.grads.div_(n)


# ================================================================================ zero_bytes_per_rank

def zero_bytes_per_rank_direct(stage: int, numel: int, world_size: int, param_bytes: int = 2,
                               grad_bytes: int = 2, optimizer_bytes: int = 12) -> dict[str, int]:
    """RIGHT: the table, with whole shards and the padded length for full buffers."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage {stage}")
    shard = _ceil_div(numel, world_size)
    padded = shard * world_size
    p = param_bytes * (shard if stage >= 3 else padded)
    g = grad_bytes * (shard if stage >= 2 else padded)
    k = optimizer_bytes * (shard if stage >= 1 else padded)
    return {"params": p, "grads": g, "optimizer": k, "total": p + g + k}


def zero_bytes_per_rank_flags(stage: int, numel: int, world_size: int, param_bytes: int = 2,
                              grad_bytes: int = 2, optimizer_bytes: int = 12) -> dict[str, int]:
    """RIGHT: a category is sharded from the stage that shards it on; elements = shard or shard * N."""
    if stage not in range(4):
        raise ValueError("stage")
    q, r = divmod(numel, world_size)
    shard = q + bool(r)
    sharded_from = {"params": 3, "grads": 2, "optimizer": 1}
    per = {"params": param_bytes, "grads": grad_bytes, "optimizer": optimizer_bytes}
    out = {}
    for name, first in sharded_from.items():
        elements = shard if stage >= first else shard * world_size
        out[name] = per[name] * elements
    out["total"] = sum(out.values())
    return out


def zero_bytes_per_rank_unpadded_full(stage: int, numel: int, world_size: int, param_bytes: int = 2,
                                      grad_bytes: int = 2, optimizer_bytes: int = 12) -> dict[str, int]:
    """WRONG: full buffers counted at Ψ, not the padded length."""
    shard = _ceil_div(numel, world_size)
    p = param_bytes * (shard if stage >= 3 else numel)
    g = grad_bytes * (shard if stage >= 2 else numel)
    k = optimizer_bytes * (shard if stage >= 1 else numel)
    return {"params": p, "grads": g, "optimizer": k, "total": p + g + k}


def zero_bytes_per_rank_floor_shard(stage: int, numel: int, world_size: int, param_bytes: int = 2,
                                    grad_bytes: int = 2, optimizer_bytes: int = 12) -> dict[str, int]:
    """WRONG: Ψ/N rounded down."""
    shard = numel // world_size
    padded = _ceil_div(numel, world_size) * world_size
    p = param_bytes * (shard if stage >= 3 else padded)
    g = grad_bytes * (shard if stage >= 2 else padded)
    k = optimizer_bytes * (shard if stage >= 1 else padded)
    return {"params": p, "grads": g, "optimizer": k, "total": p + g + k}


def zero_bytes_per_rank_ceil_bytes(stage: int, numel: int, world_size: int, param_bytes: int = 2,
                                   grad_bytes: int = 2, optimizer_bytes: int = 12) -> dict[str, int]:
    """WRONG: rounds the bytes K·Ψ/N up instead of the shard's elements (K·ceil(Ψ/N))."""
    padded = _ceil_div(numel, world_size) * world_size

    def part(b):
        return -(-(b * numel) // world_size)
    p = part(param_bytes) if stage >= 3 else param_bytes * padded
    g = part(grad_bytes) if stage >= 2 else grad_bytes * padded
    k = part(optimizer_bytes) if stage >= 1 else optimizer_bytes * padded
    return {"params": p, "grads": g, "optimizer": k, "total": p + g + k}


def zero_bytes_per_rank_stage2_shards_params(stage: int, numel: int, world_size: int, param_bytes: int = 2,
                                             grad_bytes: int = 2, optimizer_bytes: int = 12) -> dict[str, int]:
    """WRONG: the stages shifted by one for gradients: stage 1 already shards gradients."""
    shard = _ceil_div(numel, world_size)
    padded = shard * world_size
    p = param_bytes * (shard if stage >= 3 else padded)
    g = grad_bytes * (shard if stage >= 1 else padded)
    k = optimizer_bytes * (shard if stage >= 1 else padded)
    return {"params": p, "grads": g, "optimizer": k, "total": p + g + k}


# ================================================================================ comm_bytes_per_rank

def comm_bytes_per_rank_ring(stage: int, numel: int, world_size: int, param_bytes: int = 2,
                             grad_bytes: int = 2) -> int:
    """RIGHT: the collectives of one train_ranks step, counted as Comm counts them."""
    if stage not in (0, 1, 2, 3):
        raise ValueError("stage")
    n = world_size
    shard = _ceil_div(numel, n)
    padded = shard * n
    if stage == 0:
        return 2 * (n - 1) * grad_bytes * padded // n
    gathers = 1 if stage < 3 else 2
    return (n - 1) * grad_bytes * shard + gathers * (n - 1) * param_bytes * shard


def comm_bytes_per_rank_calls(stage: int, numel: int, world_size: int, param_bytes: int = 2,
                              grad_bytes: int = 2) -> int:
    """RIGHT: a list of the step's collectives, summed (all-reduce = reduce-scatter + all-gather)."""
    if stage not in range(4):
        raise ValueError("stage")
    shard = -(-numel // world_size)
    rs = (world_size - 1) * shard * grad_bytes
    ag = (world_size - 1) * shard * param_bytes
    # stage 0's all-reduce of the padded gradient = a reduce-scatter plus an all-gather of gradient shards
    calls = {0: [rs, rs], 1: [rs, ag], 2: [rs, ag], 3: [ag, ag, rs]}[stage]
    return sum(calls)


def comm_bytes_per_rank_one_gather_stage3(stage: int, numel: int, world_size: int, param_bytes: int = 2,
                                          grad_bytes: int = 2) -> int:
    """WRONG: stage 3 counts one all-gather per step (forgets the second gather before backward)."""
    n = world_size
    shard = _ceil_div(numel, n)
    padded = shard * n
    if stage == 0:
        return 2 * (n - 1) * grad_bytes * padded // n
    return (n - 1) * grad_bytes * shard + (n - 1) * param_bytes * shard


def comm_bytes_per_rank_unpadded_allreduce(stage: int, numel: int, world_size: int, param_bytes: int = 2,
                                           grad_bytes: int = 2) -> int:
    """WRONG: stage 0's all-reduce counted on Ψ elements, not the padded buffer."""
    n = world_size
    shard = _ceil_div(numel, n)
    if stage == 0:
        return 2 * (n - 1) * grad_bytes * numel // n
    gathers = 1 if stage < 3 else 2
    return (n - 1) * grad_bytes * shard + gathers * (n - 1) * param_bytes * shard


def comm_bytes_per_rank_gather_grad_bytes(stage: int, numel: int, world_size: int, param_bytes: int = 2,
                                          grad_bytes: int = 2) -> int:
    """WRONG: the parameter all-gathers of stages 1-2 counted with grad_bytes (same only when P = G)."""
    n = world_size
    shard = _ceil_div(numel, n)
    padded = shard * n
    if stage == 0:
        return 2 * (n - 1) * grad_bytes * padded // n
    if stage in (1, 2):
        return 2 * (n - 1) * grad_bytes * shard
    return (n - 1) * grad_bytes * shard + 2 * (n - 1) * param_bytes * shard


def comm_bytes_per_rank_stage3_three_param(stage: int, numel: int, world_size: int, param_bytes: int = 2,
                                           grad_bytes: int = 2) -> int:
    """WRONG: stage 3 written as '1.5x DP' = 3·(N-1)·P·shard: the reduce-scatter counted with param_bytes."""
    n = world_size
    shard = _ceil_div(numel, n)
    padded = shard * n
    if stage == 0:
        return 2 * (n - 1) * grad_bytes * padded // n
    if stage in (1, 2):
        return (n - 1) * (grad_bytes + param_bytes) * shard
    return 3 * (n - 1) * param_bytes * shard


def comm_bytes_per_rank_float_ratio(stage: int, numel: int, world_size: int, param_bytes: int = 2,
                                    grad_bytes: int = 2) -> int:
    """WRONG: the ring factor 2(N-1)/N computed in floating point and truncated with int()."""
    n = world_size
    shard = _ceil_div(numel, n)
    padded = shard * n
    if stage == 0:
        return int(2 * (n - 1) / n * grad_bytes * padded)
    gathers = 1 if stage < 3 else 2
    return int((n - 1) / n * (grad_bytes + gathers * param_bytes) * padded)


# ============================================================================ deepspeed_zero3_estimate

def deepspeed_zero3_estimate_deepspeed_order(total_params: int, largest_layer_params: int, gpus_per_node: int = 1,
                                             nodes: int = 1, offload_optimizer: bool = True,
                                             offload_params: bool = True, zero_init: bool = True,
                                             buffer_factor: float = 1.5) -> tuple[int, int]:
    """RIGHT: DeepSpeed's arithmetic, in DeepSpeed's order."""
    if offload_params and not offload_optimizer:
        raise ValueError("offloading the parameters needs the optimizer offloaded too")
    total_gpus = nodes * gpus_per_node
    gpus_factor = 1 / nodes
    largest = 4 * largest_layer_params
    if offload_optimizer:
        if offload_params:
            gpu = largest
            if zero_init:
                cpu = total_params * 18 * gpus_factor * buffer_factor
            else:
                cpu = total_params * max(4 * gpus_per_node, 18 * gpus_factor) * buffer_factor
        else:
            gpu = largest + int(2 * total_params / total_gpus)
            if zero_init:
                cpu = total_params * 16 * gpus_factor * buffer_factor
            else:
                cpu = total_params * max(4 * gpus_per_node, 16 * gpus_factor) * buffer_factor
    else:
        gpu = largest + int(18 * total_params / total_gpus)
        if zero_init:
            cpu = largest_layer_params * 4 * gpus_per_node * buffer_factor
        else:
            cpu = total_params * 4 * gpus_per_node * buffer_factor
    return int(cpu), int(gpu)


def deepspeed_zero3_estimate_table(total_params: int, largest_layer_params: int, gpus_per_node: int = 1,
                                   nodes: int = 1, offload_optimizer: bool = True, offload_params: bool = True,
                                   zero_init: bool = True, buffer_factor: float = 1.5) -> tuple[int, int]:
    """RIGHT: table-driven (bytes per parameter on CPU, extra bytes per parameter on GPU), same float order."""
    if offload_params and not offload_optimizer:
        raise ValueError("parameter offload without optimizer offload is not a DeepSpeed option")
    n_gpus = nodes * gpus_per_node
    gpu = 4 * largest_layer_params
    if offload_optimizer:
        cpu_per = 18 if offload_params else 16
        if not offload_params:
            gpu += int(2 * total_params / n_gpus)
        factor = cpu_per * (1 / nodes) if zero_init else max(4 * gpus_per_node, cpu_per * (1 / nodes))
        cpu = total_params * factor * buffer_factor
    else:
        gpu += int(18 * total_params / n_gpus)
        base = largest_layer_params if zero_init else total_params
        cpu = base * 4 * gpus_per_node * buffer_factor
    return int(cpu), int(gpu)


def deepspeed_zero3_estimate_ignores_nodes(total_params: int, largest_layer_params: int, gpus_per_node: int = 1,
                                           nodes: int = 1, offload_optimizer: bool = True,
                                           offload_params: bool = True, zero_init: bool = True,
                                           buffer_factor: float = 1.5) -> tuple[int, int]:
    """WRONG: N taken as gpus_per_node (nodes forgotten in the GPU share 2Ψ/N, 18Ψ/N)."""
    if offload_params and not offload_optimizer:
        raise ValueError("bad offload")
    total_gpus = gpus_per_node
    gpus_factor = 1 / nodes
    largest = 4 * largest_layer_params
    if offload_optimizer:
        if offload_params:
            gpu = largest
            cpu = total_params * (18 * gpus_factor if zero_init else max(4 * gpus_per_node, 18 * gpus_factor)) \
                * buffer_factor
        else:
            gpu = largest + int(2 * total_params / total_gpus)
            cpu = total_params * (16 * gpus_factor if zero_init else max(4 * gpus_per_node, 16 * gpus_factor)) \
                * buffer_factor
    else:
        gpu = largest + int(18 * total_params / total_gpus)
        cpu = (largest_layer_params if zero_init else total_params) * 4 * gpus_per_node * buffer_factor
    return int(cpu), int(gpu)


def deepspeed_zero3_estimate_no_validation(total_params: int, largest_layer_params: int, gpus_per_node: int = 1,
                                           nodes: int = 1, offload_optimizer: bool = True,
                                           offload_params: bool = True, zero_init: bool = True,
                                           buffer_factor: float = 1.5) -> tuple[int, int]:
    """WRONG: offload_params without offload_optimizer is not rejected (treated as no offload)."""
    total_gpus = nodes * gpus_per_node
    gpus_factor = 1 / nodes
    largest = 4 * largest_layer_params
    if offload_optimizer and offload_params:
        gpu = largest
        cpu = total_params * (18 * gpus_factor if zero_init else max(4 * gpus_per_node, 18 * gpus_factor)) \
            * buffer_factor
    elif offload_optimizer:
        gpu = largest + int(2 * total_params / total_gpus)
        cpu = total_params * (16 * gpus_factor if zero_init else max(4 * gpus_per_node, 16 * gpus_factor)) \
            * buffer_factor
    else:
        gpu = largest + int(18 * total_params / total_gpus)
        cpu = (largest_layer_params if zero_init else total_params) * 4 * gpus_per_node * buffer_factor
    return int(cpu), int(gpu)


def deepspeed_zero3_estimate_no_max(total_params: int, largest_layer_params: int, gpus_per_node: int = 1,
                                    nodes: int = 1, offload_optimizer: bool = True, offload_params: bool = True,
                                    zero_init: bool = True, buffer_factor: float = 1.5) -> tuple[int, int]:
    """WRONG: zero_init=False with offload uses 18/nodes (16/nodes) alone, dropping the max with 4·gpus_per_node."""
    if offload_params and not offload_optimizer:
        raise ValueError("bad offload")
    total_gpus = nodes * gpus_per_node
    gpus_factor = 1 / nodes
    largest = 4 * largest_layer_params
    if offload_optimizer:
        per = 18 if offload_params else 16
        gpu = largest if offload_params else largest + int(2 * total_params / total_gpus)
        cpu = total_params * per * gpus_factor * buffer_factor
    else:
        gpu = largest + int(18 * total_params / total_gpus)
        cpu = (largest_layer_params if zero_init else total_params) * 4 * gpus_per_node * buffer_factor
    return int(cpu), int(gpu)


def deepspeed_zero3_estimate_int_div_nodes(total_params: int, largest_layer_params: int, gpus_per_node: int = 1,
                                           nodes: int = 1, offload_optimizer: bool = True,
                                           offload_params: bool = True, zero_init: bool = True,
                                           buffer_factor: float = 1.5) -> tuple[int, int]:
    """WRONG: 18/nodes and 16/nodes written with integer division (18 // nodes)."""
    if offload_params and not offload_optimizer:
        raise ValueError("bad offload")
    total_gpus = nodes * gpus_per_node
    largest = 4 * largest_layer_params
    if offload_optimizer:
        per = (18 if offload_params else 16) // nodes
        gpu = largest if offload_params else largest + int(2 * total_params / total_gpus)
        factor = per if zero_init else max(4 * gpus_per_node, per)
        cpu = total_params * factor * buffer_factor
    else:
        gpu = largest + int(18 * total_params / total_gpus)
        cpu = (largest_layer_params if zero_init else total_params) * 4 * gpus_per_node * buffer_factor
    return int(cpu), int(gpu)


def deepspeed_zero3_estimate_round(total_params: int, largest_layer_params: int, gpus_per_node: int = 1,
                                   nodes: int = 1, offload_optimizer: bool = True, offload_params: bool = True,
                                   zero_init: bool = True, buffer_factor: float = 1.5) -> tuple[int, int]:
    """WRONG: round() instead of int() truncation for the per-GPU share and the CPU bytes."""
    if offload_params and not offload_optimizer:
        raise ValueError("bad offload")
    total_gpus = nodes * gpus_per_node
    gpus_factor = 1 / nodes
    largest = 4 * largest_layer_params
    if offload_optimizer:
        per = 18 if offload_params else 16
        gpu = largest if offload_params else largest + round(2 * total_params / total_gpus)
        factor = per * gpus_factor if zero_init else max(4 * gpus_per_node, per * gpus_factor)
        cpu = total_params * factor * buffer_factor
    else:
        gpu = largest + round(18 * total_params / total_gpus)
        cpu = (largest_layer_params if zero_init else total_params) * 4 * gpus_per_node * buffer_factor
    return round(cpu), int(gpu)


def deepspeed_zero3_estimate_none_ignores_zero_init(total_params: int, largest_layer_params: int,
                                                    gpus_per_node: int = 1, nodes: int = 1,
                                                    offload_optimizer: bool = True, offload_params: bool = True,
                                                    zero_init: bool = True,
                                                    buffer_factor: float = 1.5) -> tuple[int, int]:
    """WRONG: without offload the CPU bytes are 4·Ψ·gpus_per_node·β whatever zero_init (L column ignored)."""
    if offload_params and not offload_optimizer:
        raise ValueError("bad offload")
    total_gpus = nodes * gpus_per_node
    gpus_factor = 1 / nodes
    largest = 4 * largest_layer_params
    if offload_optimizer:
        per = 18 if offload_params else 16
        gpu = largest if offload_params else largest + int(2 * total_params / total_gpus)
        factor = per * gpus_factor if zero_init else max(4 * gpus_per_node, per * gpus_factor)
        cpu = total_params * factor * buffer_factor
    else:
        gpu = largest + int(18 * total_params / total_gpus)
        cpu = total_params * 4 * gpus_per_node * buffer_factor
    return int(cpu), int(gpu)


# ================================================================================== prefetch_timeline

def _schedule(compute_ms, gather_ms, prefetch):
    gs, ge, cs, ce = [], [], [], []
    for i in range(len(compute_ms)):
        s = ge[i - 1] if i else 0.0
        j = i - prefetch - 1
        if j >= 0:
            s = max(s, ce[j])
        gs.append(s)
        ge.append(s + gather_ms[i])
        c = max(ce[i - 1] if i else 0.0, ge[i])
        cs.append(c)
        ce.append(c + compute_ms[i])
    return gs, ge, cs, ce


def _sweep_peak(starts, ends, sizes):
    events = [(e, 0, -b) for e, b in zip(ends, sizes)] + [(s, 1, b) for s, b in zip(starts, sizes)]
    events.sort(key=lambda t: (t[0], t[1]))  # at equal times a release comes before an acquisition
    cur = peak = 0
    for _, _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def _check_lists(compute_ms, gather_ms, unit_bytes, prefetch):
    if not (len(compute_ms) == len(gather_ms) == len(unit_bytes)):
        raise ValueError("compute_ms, gather_ms and unit_bytes must have the same length")
    if prefetch < 0:
        raise ValueError("prefetch must be >= 0")


def prefetch_timeline_sweep(compute_ms: list[float], gather_ms: list[float], unit_bytes: list[int],
                            prefetch: int = 1) -> dict:
    """RIGHT: the recurrences, then an event sweep for the peak (release before acquire at equal times)."""
    _check_lists(compute_ms, gather_ms, unit_bytes, prefetch)
    gs, ge, cs, ce = _schedule(compute_ms, gather_ms, prefetch)
    total = ce[-1] if ce else 0.0
    return {"gather_start": gs, "compute_start": cs, "total_ms": total, "exposed_ms": total - sum(compute_ms),
            "peak_bytes": _sweep_peak(gs, ce, unit_bytes)}


def prefetch_timeline_at_gathers(compute_ms: list[float], gather_ms: list[float], unit_bytes: list[int],
                                 prefetch: int = 1) -> dict:
    """RIGHT: a two-stream event loop with a window of held units; peak evaluated at each gather start."""
    _check_lists(compute_ms, gather_ms, unit_bytes, prefetch)
    n = len(compute_ms)
    gather_start, compute_start, compute_end = [0.0] * n, [0.0] * n, [0.0] * n
    comm_free = 0.0
    comp_free = 0.0
    for i in range(n):
        ready = compute_end[i - prefetch - 1] if i - prefetch - 1 >= 0 else 0.0
        gather_start[i] = max(comm_free, ready)
        comm_free = gather_start[i] + gather_ms[i]
        compute_start[i] = max(comp_free, comm_free)
        comp_free = compute_end[i] = compute_start[i] + compute_ms[i]
    peak = 0
    for i in range(n):
        t = gather_start[i]
        held = sum(unit_bytes[j] for j in range(n) if gather_start[j] <= t < compute_end[j])
        peak = max(peak, held, unit_bytes[i])
    total = compute_end[-1] if n else 0.0
    return {"gather_start": gather_start, "compute_start": compute_start, "total_ms": total,
            "exposed_ms": total - sum(compute_ms), "peak_bytes": peak}


def prefetch_timeline_parallel_gathers(compute_ms: list[float], gather_ms: list[float], unit_bytes: list[int],
                                       prefetch: int = 1) -> dict:
    """WRONG: gathers are not serialised on the comm stream: gather i starts as soon as unit i-k-1 is done."""
    _check_lists(compute_ms, gather_ms, unit_bytes, prefetch)
    gs, ge, cs, ce = [], [], [], []
    for i in range(len(compute_ms)):
        j = i - prefetch - 1
        s = ce[j] if j >= 0 else 0.0
        gs.append(s)
        ge.append(s + gather_ms[i])
        c = max(ce[i - 1] if i else 0.0, ge[i])
        cs.append(c)
        ce.append(c + compute_ms[i])
    total = ce[-1] if ce else 0.0
    return {"gather_start": gs, "compute_start": cs, "total_ms": total, "exposed_ms": total - sum(compute_ms),
            "peak_bytes": _sweep_peak(gs, ce, unit_bytes)}


def prefetch_timeline_peak_k_largest(compute_ms: list[float], gather_ms: list[float], unit_bytes: list[int],
                                     prefetch: int = 1) -> dict:
    """WRONG: peak_bytes = the sum of the k+1 largest units (not the units actually held together)."""
    _check_lists(compute_ms, gather_ms, unit_bytes, prefetch)
    gs, ge, cs, ce = _schedule(compute_ms, gather_ms, prefetch)
    total = ce[-1] if ce else 0.0
    peak = sum(sorted(unit_bytes, reverse=True)[:prefetch + 1])
    return {"gather_start": gs, "compute_start": cs, "total_ms": total, "exposed_ms": total - sum(compute_ms),
            "peak_bytes": peak}


def prefetch_timeline_closed_intervals(compute_ms: list[float], gather_ms: list[float], unit_bytes: list[int],
                                       prefetch: int = 1) -> dict:
    """WRONG: a unit freed at time t still counted when the next gather starts at t (acquire before release)."""
    _check_lists(compute_ms, gather_ms, unit_bytes, prefetch)
    gs, ge, cs, ce = _schedule(compute_ms, gather_ms, prefetch)
    total = ce[-1] if ce else 0.0
    peak = 0
    for i in range(len(gs)):
        held = sum(b for s, e, b in zip(gs, ce, unit_bytes) if s <= gs[i] <= e)
        peak = max(peak, held)
    return {"gather_start": gs, "compute_start": cs, "total_ms": total, "exposed_ms": total - sum(compute_ms),
            "peak_bytes": peak}


def prefetch_timeline_peak_at_compute(compute_ms: list[float], gather_ms: list[float], unit_bytes: list[int],
                                      prefetch: int = 1) -> dict:
    """WRONG: bytes held sampled only at compute starts (misses gathers that start mid-compute)."""
    _check_lists(compute_ms, gather_ms, unit_bytes, prefetch)
    gs, ge, cs, ce = _schedule(compute_ms, gather_ms, prefetch)
    total = ce[-1] if ce else 0.0
    peak = 0
    for t in cs:
        held = sum(b for s, e, b in zip(gs, ce, unit_bytes) if s <= t < e)
        peak = max(peak, held)
    return {"gather_start": gs, "compute_start": cs, "total_ms": total, "exposed_ms": total - sum(compute_ms),
            "peak_bytes": peak}


def prefetch_timeline_window_from_start(compute_ms: list[float], gather_ms: list[float], unit_bytes: list[int],
                                        prefetch: int = 1) -> dict:
    """WRONG: gather i may start once unit i-k-1 *starts* computing (its parameters freed too early)."""
    _check_lists(compute_ms, gather_ms, unit_bytes, prefetch)
    gs, ge, cs, ce = [], [], [], []
    for i in range(len(compute_ms)):
        s = ge[i - 1] if i else 0.0
        j = i - prefetch - 1
        if j >= 0:
            s = max(s, cs[j])
        gs.append(s)
        ge.append(s + gather_ms[i])
        c = max(ce[i - 1] if i else 0.0, ge[i])
        cs.append(c)
        ce.append(c + compute_ms[i])
    total = ce[-1] if ce else 0.0
    return {"gather_start": gs, "compute_start": cs, "total_ms": total, "exposed_ms": total - sum(compute_ms),
            "peak_bytes": _sweep_peak(gs, ce, unit_bytes)}


def prefetch_timeline_exposed_gathers(compute_ms: list[float], gather_ms: list[float], unit_bytes: list[int],
                                      prefetch: int = 1) -> dict:
    """WRONG: exposed_ms = total - sum of gathers (the other stream) instead of total - sum of compute."""
    _check_lists(compute_ms, gather_ms, unit_bytes, prefetch)
    gs, ge, cs, ce = _schedule(compute_ms, gather_ms, prefetch)
    total = ce[-1] if ce else 0.0
    exposed = total - sum(compute_ms) if sum(gather_ms) <= sum(compute_ms) else total - sum(gather_ms)
    return {"gather_start": gs, "compute_start": cs, "total_ms": total, "exposed_ms": exposed,
            "peak_bytes": _sweep_peak(gs, ce, unit_bytes)}


# ============================================================================================== registry

def _gloo(opt="ref", zb="ref"):
    return {"ZeroAdamW": opt, "zero_bytes_per_rank": zb}


BLIND = {
    "shard_bounds": {
        "wrong": ["shard_bounds_floor", "shard_bounds_clipped_stop", "shard_bounds_float_ceil",
                  "shard_bounds_min_one", "shard_bounds_rank_off_by_one", "shard_bounds_no_numel_check",
                  "shard_bounds_zero_world"],
        "right": ["shard_bounds_ceil_div", "shard_bounds_divmod"],
    },
    "zero_adamw": {
        "wrong": ["ZeroAdamW_divide_before_sum", "ZeroAdamW_no_copy_back_stage3", "ZeroAdamW_gather_ignores_out",
                  "ZeroAdamW_unpadded_gather", "ZeroAdamW_stage1_all_reduce", "ZeroAdamW_stage3_gathers_after_step",
                  "ZeroAdamW_no_stage_check", "ZeroAdamW_garbage_grad_padding"],
        "right": ["ZeroAdamW_views", "ZeroAdamW_lazy_separate_paths"],
    },
    "zero_memory": {
        "wrong": ["ZeroAdamW_fp32_second_master", "ZeroAdamW_stage2_keeps_full_grad", "ZeroAdamW_keeps_last_grad",
                  "ZeroAdamW_mixed_master_unlisted", "ZeroAdamW_lists_step_count",
                  "ZeroAdamW_stage0_unpadded_grads", "ZeroAdamW_fp32_grad_buffer"],
        "right": ["ZeroAdamW_views", "ZeroAdamW_lazy_separate_paths"],
    },
    "zero_bytes_per_rank": {
        "wrong": ["zero_bytes_per_rank_unpadded_full", "zero_bytes_per_rank_floor_shard",
                  "zero_bytes_per_rank_ceil_bytes", "zero_bytes_per_rank_stage2_shards_params"],
        "right": ["zero_bytes_per_rank_direct", "zero_bytes_per_rank_flags"],
    },
    "comm_bytes_per_rank": {
        "wrong": ["comm_bytes_per_rank_one_gather_stage3", "comm_bytes_per_rank_unpadded_allreduce",
                  "comm_bytes_per_rank_gather_grad_bytes", "comm_bytes_per_rank_stage3_three_param",
                  "comm_bytes_per_rank_float_ratio"],
        "right": ["comm_bytes_per_rank_ring", "comm_bytes_per_rank_calls"],
    },
    "zero_on_gloo": {
        "wrong": [_gloo(opt="ZeroAdamW_fp32_second_master"), _gloo(opt="ZeroAdamW_stage2_keeps_full_grad"),
                  _gloo(opt="ZeroAdamW_keeps_last_grad"), _gloo(opt="ZeroAdamW_stage0_unpadded_grads"),
                  _gloo(zb="zero_bytes_per_rank_unpadded_full"), _gloo(zb="zero_bytes_per_rank_floor_shard"),
                  _gloo(zb="zero_bytes_per_rank_stage2_shards_params"), _gloo(opt="ZeroAdamW_gather_ignores_out")],
        "right": [_gloo(opt="ZeroAdamW_views"), _gloo(opt="ZeroAdamW_lazy_separate_paths"),
                  _gloo(zb="zero_bytes_per_rank_direct"), _gloo(zb="zero_bytes_per_rank_flags")],
    },
    "deepspeed_estimate": {
        "wrong": ["deepspeed_zero3_estimate_ignores_nodes", "deepspeed_zero3_estimate_no_validation",
                  "deepspeed_zero3_estimate_no_max", "deepspeed_zero3_estimate_int_div_nodes",
                  "deepspeed_zero3_estimate_round", "deepspeed_zero3_estimate_none_ignores_zero_init"],
        "right": ["deepspeed_zero3_estimate_deepspeed_order", "deepspeed_zero3_estimate_table"],
    },
    "prefetch_timeline": {
        "wrong": ["prefetch_timeline_parallel_gathers", "prefetch_timeline_peak_k_largest",
                  "prefetch_timeline_closed_intervals", "prefetch_timeline_peak_at_compute",
                  "prefetch_timeline_window_from_start", "prefetch_timeline_exposed_gathers"],
        "right": ["prefetch_timeline_sweep", "prefetch_timeline_at_gathers"],
    },
}

WHY = {
    "shard_bounds_floor": "floor(numel/N) shards: the text says each shard has ceil(Ψ/N) elements, padded",
    "shard_bounds_clipped_stop": "stop clipped to numel: the text says stop may run past numel (equal shards)",
    "shard_bounds_float_ceil": "math.ceil(numel / N) through a float: wrong for numel above 2**53",
    "shard_bounds_min_one": "shards forced to at least 1 element: numel=0 must give empty shards [0, 0)",
    "shard_bounds_rank_off_by_one": "rank == world_size accepted: the text says a rank outside 0..N-1 raises",
    "shard_bounds_no_numel_check": "negative numel not rejected: the text says it must raise ValueError",
    "shard_bounds_zero_world": "tests world_size < 0, so world_size 0 raises ZeroDivisionError, not ValueError",
    "ZeroAdamW_divide_before_sum": "divides each gradient by N before reducing: the text says sum first, then "
                                   "divide (bitwise equal only when N is a power of 2)",
    "ZeroAdamW_no_copy_back_stage3": "bf16/fp16 stage 3 never copies the fp32 master back into its param shard",
    "ZeroAdamW_gather_ignores_out": "stage 3 gather_params ignores `out` (text: all-gathers into `out`), so the "
                                    "buffer train_ranks refills before backward stays NaN",
    "ZeroAdamW_unpadded_gather": "stages 0-2 gather_params return params[:numel]: text says the padded vector",
    "ZeroAdamW_stage1_all_reduce": "stage 1 all-reduces then slices instead of reduce-scattering: 2x gradient "
                                   "traffic, against the stage-1 description",
    "ZeroAdamW_stage3_gathers_after_step": "stage 3 all-gathers after its update: the text says it stops there",
    "ZeroAdamW_no_stage_check": "no ValueError for a stage outside 0-3 (clamped instead)",
    "ZeroAdamW_garbage_grad_padding": "stages 2-3 pad the gradient with uninitialised memory, not zeros: padding "
                                      "params drift (text: padded with zeros)",
    "ZeroAdamW_fp32_second_master": "keeps a second fp32 master copy in fp32: text says fp32 params are their "
                                    "own master copy",
    "ZeroAdamW_stage2_keeps_full_grad": "stage 2/3 keep a padded full gradient buffer between steps, unlisted: "
                                        "text says no full gradient buffer survives the step",
    "ZeroAdamW_keeps_last_grad": "stores the local gradient on self: a Ψ-element tensor alive after the step",
    "ZeroAdamW_mixed_master_unlisted": "bf16/fp16 fp32 master kept but missing from buffers()['optimizer']",
    "ZeroAdamW_lists_step_count": "buffers() lists AdamW's scalar step tensor: text says not its step count",
    "ZeroAdamW_stage0_unpadded_grads": "stage 0 keeps an unpadded Ψ gradient buffer: the table says full padded "
                                       "vector (differs only when N does not divide Ψ)",
    "ZeroAdamW_fp32_grad_buffer": "gradient buffer kept in fp32 under bf16/fp16: the table says gradients in "
                                  "param_dtype",
    "zero_bytes_per_rank_unpadded_full": "full buffers counted at Ψ, not the padded length the text asks for",
    "zero_bytes_per_rank_floor_shard": "Ψ/N rounded down; text: rounded up to whole shards",
    "zero_bytes_per_rank_ceil_bytes": "rounds K·Ψ/N bytes up instead of K·ceil(Ψ/N): whole shards, not bytes",
    "zero_bytes_per_rank_stage2_shards_params": "stage 1 shards gradients too (stage table misread)",
    "comm_bytes_per_rank_one_gather_stage3": "stage 3 counts one all-gather; text: gathers twice per step",
    "comm_bytes_per_rank_unpadded_allreduce": "stage 0 all-reduce counted on Ψ, not the padded buffer it reduces",
    "comm_bytes_per_rank_gather_grad_bytes": "stages 1-2 all-gather of *parameters* counted with grad_bytes",
    "comm_bytes_per_rank_stage3_three_param": "stage 3 as 3(N-1)·P·shard: the reduce-scatter uses G, not P",
    "comm_bytes_per_rank_float_ratio": "ring factor (N-1)/N in float, then int(): truncation loses a byte",
    "deepspeed_zero3_estimate_ignores_nodes": "N = gpus_per_node: text says N GPUs in all (x nodes)",
    "deepspeed_zero3_estimate_no_validation": "offload_params without offload_optimizer not rejected (ValueError)",
    "deepspeed_zero3_estimate_no_max": "zero_init=False drops max(4·gpus_per_node, 18/nodes) for 18/nodes",
    "deepspeed_zero3_estimate_int_div_nodes": "18//nodes, 16//nodes integer division: wrong for nodes = 4, 5, ...",
    "deepspeed_zero3_estimate_round": "round() instead of int() truncation (text: truncated as DeepSpeed does)",
    "deepspeed_zero3_estimate_none_ignores_zero_init": "no offload: CPU bytes 4·Ψ·gpn·β even with zero_init "
                                                       "(table: 4·L·gpus_per_node·β)",
    "prefetch_timeline_parallel_gathers": "gathers not serialised: text says gathers run one after another",
    "prefetch_timeline_peak_k_largest": "peak = sum of k+1 largest units, not what is held together",
    "prefetch_timeline_closed_intervals": "a unit freed at t still counted for a gather starting at t: at most "
                                          "k+1 units held, so release comes first",
    "prefetch_timeline_peak_at_compute": "bytes held sampled only at compute starts, missing mid-compute gathers",
    "prefetch_timeline_window_from_start": "gather i waits for unit i-k-1 to start, not finish, computing",
    "prefetch_timeline_exposed_gathers": "exposed_ms = total - sum(gather) when gathers dominate: text says "
                                         "total minus the sum of compute",
}
