"""Data-parallel training of the course GPT with a sharded optimizer: what lesson 03's ZeRO code runs on.

The lesson's optimizer talks to its peers through a Comm: three collectives, each counting the
bytes this rank sends. Two Comms exist, and the same optimizer runs on both:

    simulate(world_size, fn)    N ranks as threads of one process (SimComm): reductions in rank order,
                                so results can equal unsharded AdamW bit for bit
    TorchComm()                 a rank of torch.distributed (gloo on CPU, NCCL on GPUs)

train_ranks() is one rank's training loop (the course GPT on the rank's own micro-batches, through a flat
parameter vector); reference_training() is unsharded AdamW on the mean of the same gradients.

Bytes sent are counted as the ring algorithms send them, per rank: an all-reduce of B bytes sends
2(N-1)/N·B, a reduce-scatter to B-byte shards (N-1)·B, an all-gather of B-byte shards (N-1)·B.
"""
from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.func import functional_call

from memfit.gpt import COURSE_CONFIGS, GPT, GPTConfig
from memfit.meter import open_meter


# ----------------------------------------------------------------------------------------- comms

class Comm:
    """What one rank of a data-parallel group can do. Sums, never means: divide by world_size yourself."""

    rank: int
    world_size: int

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.sent_bytes = 0
        self.calls: list[tuple[str, int]] = []  # (collective, bytes this rank sent)

    def _count(self, kind: str, nbytes: int) -> None:
        self.sent_bytes += nbytes
        self.calls.append((kind, nbytes))

    @staticmethod
    def _need(cond: bool, message: str) -> None:
        if not cond:
            raise ValueError(message)

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """tensor <- the sum of every rank's tensor, in place."""
        n = self.world_size
        self._need(tensor.is_contiguous(), "all_reduce needs a contiguous tensor")
        self._count("all_reduce", 2 * (n - 1) * tensor.nbytes // n)
        self._all_reduce(tensor)

    def reduce_scatter(self, out: torch.Tensor, full: torch.Tensor) -> None:
        """out <- chunk `rank` of the sum of every rank's `full` (full has world_size·out.numel() elements)."""
        self._need(full.numel() == out.numel() * self.world_size,
                   f"reduce_scatter: full has {full.numel()} elements, expected world_size x out = "
                   f"{self.world_size} x {out.numel()} (pad the flat vector to a multiple of world_size)")
        self._need(out.dtype == full.dtype, f"reduce_scatter: out is {out.dtype}, full is {full.dtype}")
        self._need(out.is_contiguous() and full.is_contiguous(), "reduce_scatter needs contiguous tensors")
        self._count("reduce_scatter", (self.world_size - 1) * out.nbytes)
        self._reduce_scatter(out, full)

    def all_gather(self, out: torch.Tensor, shard: torch.Tensor) -> None:
        """out <- every rank's shard, in rank order (out has world_size·shard.numel() elements)."""
        self._need(out.numel() == shard.numel() * self.world_size,
                   f"all_gather: out has {out.numel()} elements, expected world_size x shard = "
                   f"{self.world_size} x {shard.numel()}")
        self._need(out.dtype == shard.dtype, f"all_gather: out is {out.dtype}, shard is {shard.dtype}")
        self._need(out.is_contiguous() and shard.is_contiguous(), "all_gather needs contiguous tensors")
        self._count("all_gather", (self.world_size - 1) * shard.nbytes)
        self._all_gather(out, shard)

    def ring_pass(self, tensor: torch.Tensor) -> torch.Tensor:
        """Send tensor to rank + 1 and return, in a new tensor, what rank - 1 sent (ranks in a ring, as ring
        attention passes K and V). Sends tensor.nbytes (nothing with one rank: the tensor comes back, copied)."""
        self._need(tensor.is_contiguous(), "ring_pass needs a contiguous tensor")
        self._count("ring_pass", tensor.nbytes if self.world_size > 1 else 0)
        return self._ring_pass(tensor)

    def settle(self) -> None:
        """Wait until no collective of this rank still holds a tensor (after the last step, before measuring)."""

    def _ring_pass(self, tensor): raise NotImplementedError
    def _all_reduce(self, tensor): raise NotImplementedError
    def _reduce_scatter(self, out, full): raise NotImplementedError
    def _all_gather(self, out, shard): raise NotImplementedError


class _Rendezvous:
    def __init__(self, world_size: int, timeout_s: float) -> None:
        self.slots: list[Any] = [None] * world_size
        self.barrier = threading.Barrier(world_size, timeout=timeout_s)
        self.compute = threading.Lock()  # forward/backward one rank at a time: the same kernels as the reference


class SimComm(Comm):
    """A rank of simulate(): collectives between threads. Sums run in rank order (0, 1, ..., N-1)."""

    def __init__(self, rank: int, world_size: int, rendezvous: _Rendezvous) -> None:
        super().__init__(rank, world_size)
        self._rv = rendezvous

    def _exchange(self, item) -> list:
        """Post item, wait for every rank's; return them all. A second wait comes after the caller reads."""
        self._rv.slots[self.rank] = item
        self._rv.barrier.wait()
        return list(self._rv.slots)

    def _done_reading(self) -> None:
        self._rv.barrier.wait()
        self._rv.slots[self.rank] = None  # every peer has read it: the simulation must not keep it alive

    @staticmethod
    def _sum(tensors: list[torch.Tensor]) -> torch.Tensor:
        total = tensors[0].clone()
        for t in tensors[1:]:
            total += t
        return total

    def _all_reduce(self, tensor):
        total = self._sum(self._exchange(tensor))
        self._done_reading()
        tensor.copy_(total)

    def _reduce_scatter(self, out, full):
        k = out.numel()
        chunk = self._sum([f.reshape(-1)[self.rank * k:(self.rank + 1) * k] for f in self._exchange(full)])
        self._done_reading()
        out.copy_(chunk.view_as(out))

    def _all_gather(self, out, shard):
        gathered = torch.cat([s.reshape(-1) for s in self._exchange(shard)])
        self._done_reading()
        out.copy_(gathered.view_as(out))

    def _ring_pass(self, tensor):
        received = self._exchange(tensor)[(self.rank - 1) % self.world_size].clone()
        self._done_reading()
        return received


def single_rank() -> SimComm:
    """A world of one rank: its collectives copy (a step can be taken, or a constructor tried, alone)."""
    return SimComm(0, 1, _Rendezvous(1, timeout_s=5))


class TorchComm(Comm):
    """This process's rank of the default torch.distributed process group."""

    def __init__(self) -> None:
        import torch.distributed as dist
        self._dist = dist
        super().__init__(dist.get_rank(), dist.get_world_size())
        # settle()'s meeting point, made now, before any meter starts. dist.barrier() would allocate a
        # 1-byte tensor per call, and torch 2.11's gloo keeps the last one alive: one byte "at rest".
        device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
        self._meeting = torch.zeros(1, device=device)

    def settle(self) -> None:
        # gloo's worker thread drops its reference to a finished collective's tensors a moment after the
        # caller returns: a temporary the caller passed (a clone of a shard) can outlive the call briefly.
        self._dist.all_reduce(self._meeting)
        time.sleep(0.05)

    def _all_reduce(self, tensor):
        self._dist.all_reduce(tensor)

    def _reduce_scatter(self, out, full):
        self._dist.reduce_scatter_tensor(out, full)

    def _all_gather(self, out, shard):
        self._dist.all_gather_into_tensor(out, shard.contiguous())

    def _ring_pass(self, tensor):
        received = torch.empty_like(tensor)
        if self.world_size == 1:
            return received.copy_(tensor)
        dist, n = self._dist, self.world_size
        ops = [dist.P2POp(dist.isend, tensor, (self.rank + 1) % n), dist.P2POp(dist.irecv, received, (self.rank - 1) % n)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return received


class SimulationFailed(RuntimeError):
    """A simulated rank raised, or the ranks stopped meeting at a collective within the time limit."""


def simulate(world_size: int, fn: Callable[[SimComm], Any], timeout_s: float = 120.0) -> list[Any]:
    """Run fn(comm) as `world_size` ranks (threads of this process); return their results in rank order.

    A rank that raises breaks the rendezvous, so its peers stop at their next collective instead of
    waiting forever; the first error is raised again with its rank named.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    rv = _Rendezvous(world_size, timeout_s)
    results: list[Any] = [None] * world_size
    errors: dict[int, BaseException] = {}

    def run(rank: int) -> None:
        try:
            results[rank] = fn(SimComm(rank, world_size, rv))
        except BaseException as exc:  # noqa: BLE001 (reported below, with the rank)
            errors[rank] = exc
            rv.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,), daemon=True, name=f"rank{r}") for r in range(world_size)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s + 5  # a wait at a collective times out first, with its own message
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        rv.barrier.abort()
        raise SimulationFailed(f"simulated ranks still running after {timeout_s:.0f} s")
    if errors:
        # A broken barrier is a consequence; report the rank that raised something else.
        causes = {r: e for r, e in errors.items() if not isinstance(e, threading.BrokenBarrierError)} or errors
        rank, exc = min(causes.items())
        if isinstance(exc, threading.BrokenBarrierError):
            raise SimulationFailed(f"rank {rank} waited at a collective its peers never joined "
                                   "(every rank must call the same collectives in the same order)") from exc
        raise exc
    return results


# ------------------------------------------------------------------- the model as a flat vector

_GLOBAL_RNG = threading.Lock()

@dataclass(frozen=True)
class FlatModel:
    """The course GPT seen as one flat parameter vector: a layout, and a loss of (vector, batch)."""
    cfg: GPTConfig
    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    numel: int

    @classmethod
    def of(cls, cfg: GPTConfig) -> FlatModel:
        with torch.device("meta"):
            named = list(dict(GPT(cfg).named_parameters()).items())  # a tied weight is listed once
        return cls(cfg, tuple(n for n, _ in named), tuple(p.shape for _, p in named),
                   sum(p.numel() for _, p in named))

    def initial(self, seed: int = 0, device="cpu") -> torch.Tensor:
        """The fp32 parameters of a freshly initialised GPT, flattened (the same on every rank)."""
        with _GLOBAL_RNG:  # simulated ranks are threads: seeding and drawing must not interleave
            torch.manual_seed(seed)
            with torch.device(device):
                model = GPT(self.cfg)
        return torch.cat([p.detach().reshape(-1) for p in dict(model.named_parameters()).values()])

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, offset = {}, 0
        for name, shape in zip(self.names, self.shapes):
            n = shape.numel()
            out[name] = flat[offset:offset + n].view(shape)
            offset += n
        return out

    def loss(self, flat: torch.Tensor, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self._loss(self.views(flat), idx, targets)

    def _loss(self, params: dict, idx, targets) -> torch.Tensor:
        with torch.device("meta"):
            skeleton = GPT(self.cfg)  # one per call: functional_call swaps attributes, threads must not share
        return functional_call(skeleton, params, (idx, targets))

    def gradient(self, flat: torch.Tensor, idx, targets, between: Callable[[], None] | None = None,
                 lock=None) -> torch.Tensor:
        """The gradient of the loss with respect to the flat vector `flat` (which it does not modify).

        Each parameter is a leaf viewing `flat`; their gradients are copied into one flat tensor. (Asking
        autograd for the gradient of `flat` itself would make every slice's backward a flat-sized tensor.)
        between() runs after forward, before backward.
        """
        lock = lock or _NO_LOCK
        leaves = {n: v.detach().requires_grad_(True) for n, v in self.views(flat.detach()).items()}
        with lock:
            loss = self._loss(leaves, idx, targets)
        if between is not None:
            between()
        # Backward on this thread: an autograd engine that started its GPU threads cannot be forked, and
        # run_distributed forks ranks from this process when the optimizer is not importable.
        with lock, torch.autograd.set_multithreading_enabled(False):
            grads = torch.autograd.grad(loss, list(leaves.values()))
        del loss, leaves
        out = torch.empty(self.numel, dtype=flat.dtype, device=flat.device)
        for dst, g in zip(self.views(out).values(), grads):
            dst.copy_(g)
        return out


def rank_batch(cfg: GPTConfig, step: int, rank: int, batch: int, seq: int, device="cpu"):
    """The micro-batch rank `rank` trains on at step `step` (inputs, targets): fixed by the three numbers."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=g).to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


# ------------------------------------------------------------------------------- training loops

@dataclass
class RankReport:
    """What one rank of train_ranks saw."""
    rank: int
    final: torch.Tensor | None  # the full parameters after training (fp32), on rank 0 only
    buffers: dict[str, int]  # bytes by category the optimizer holds at rest
    at_rest: int  # bytes alive after the last step (measured)
    peak: int  # the highest bytes alive during a step (measured)
    sent_per_step: int  # bytes this rank sent in its collectives, per step
    calls: list = field(default_factory=list)  # the collectives of the last step
    workspace: int = 0  # cuBLAS workspace created before the measurement (GPU), not in at_rest or peak


def buffer_bytes(optimizer) -> dict[str, int]:
    """Bytes by category of what optimizer.buffers() holds (one storage counted once)."""
    seen, out = set(), {}
    for category, tensors in optimizer.buffers().items():
        total = 0
        for t in tensors:
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
            if t.numel() and key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
        out[category] = total
    return out


def train_ranks(optimizer_cls, comm: Comm, stage: int, *, cfg: GPTConfig | str = "tiny", steps: int = 2,
                batch: int = 2, seq: int = 16, param_dtype: torch.dtype = torch.float32, device="cpu",
                opt_args: dict | None = None, seed: int = 0) -> RankReport:
    """Train the course GPT for `steps` steps as rank comm.rank, with optimizer_cls(params, comm, stage, ...).

    A step: gather the parameters (ZeRO-3 all-gathers them), forward; ZeRO-3 then frees the gathered
    storage and gathers again before backward, as FSDP does; backward gives this rank's gradient of
    the flat vector; optimizer.step(grad) reduces it and updates. Measured on this rank: bytes at rest
    after the last step and the peak during it.
    """
    cfg = COURSE_CONFIGS[cfg] if isinstance(cfg, str) else cfg
    device = torch.device(device)
    flat_model = FlatModel.of(cfg)
    with open_meter(device, stat="allocated") as meter:  # before anything of this run exists on the device
        init = flat_model.initial(seed, device)
        opt = optimizer_cls(init, comm, stage, param_dtype=param_dtype, **(opt_args or {}))
        del init
        for step in range(steps):
            idx, targets = rank_batch(cfg, step, comm.rank, batch, seq, device)
            if step == steps - 1:
                meter.reset_peak()
                sent_before, calls_before = comm.sent_bytes, len(comm.calls)
            grad = _local_gradient(opt, flat_model, stage, idx, targets, comm)
            del idx, targets
            opt.step(grad)
            del grad
        comm.settle()
        gc.collect()  # "alive" means reachable: a tensor in a collectable cycle (a traceback, a closure) is not
        at_rest, peak = meter.current, meter.peak
        sent = comm.sent_bytes - sent_before
        calls = comm.calls[calls_before:]
    final = opt.gather_params()[:flat_model.numel].float().clone()
    report = RankReport(comm.rank, final if comm.rank == 0 else None, buffer_bytes(opt), at_rest, peak, sent, calls,
                        meter.workspace)
    return report


def _local_gradient(opt, flat_model: FlatModel, stage: int, idx, targets, comm) -> torch.Tensor:
    buffer = opt.gather_params()  # padded; for ZeRO-3 a fresh all-gathered buffer
    flat = buffer.data[:flat_model.numel]

    def refill():
        # What FSDP does after forward: free the gathered storage (autograd keeps views of it) and
        # gather into it again just before backward. .data: the refill must not count as an in-place
        # change to tensors autograd saved.
        storage = flat.untyped_storage()
        nbytes = storage.nbytes()
        storage.resize_(0)
        storage.resize_(nbytes)
        buffer.data.fill_(float("nan"))  # new storage may hold the old bytes: a gather that ignores out must show
        opt.gather_params(out=buffer.data)

    lock = getattr(getattr(comm, "_rv", None), "compute", None)
    return flat_model.gradient(flat, idx, targets, refill if stage == 3 else None, lock)


class _NoLock:
    def __enter__(self): return self
    def __exit__(self, *exc): return False


_NO_LOCK = _NoLock()


def reference_training(world_size: int, *, cfg: GPTConfig | str = "tiny", steps: int = 2, batch: int = 2,
                       seq: int = 16, opt_args: dict | None = None, seed: int = 0, device="cpu") -> torch.Tensor:
    """Unsharded AdamW (torch.optim.AdamW, foreach=False) on the mean of the ranks' gradients, summed in
    rank order then divided by world_size: the result every ZeRO stage must reproduce in fp32."""
    cfg = COURSE_CONFIGS[cfg] if isinstance(cfg, str) else cfg
    flat_model = FlatModel.of(cfg)
    params = flat_model.initial(seed, device)
    opt = torch.optim.AdamW([params], foreach=False, **(opt_args or {}))
    for step in range(steps):
        grads = []
        for rank in range(world_size):
            idx, targets = rank_batch(cfg, step, rank, batch, seq, device)
            grads.append(flat_model.gradient(params, idx, targets))
        total = grads[0].clone()
        for g in grads[1:]:
            total += g
        params.grad = total.div_(world_size)
        opt.step()
        params.grad = None
    return params.detach()


def run_distributed(optimizer, world_size: int, stage: int, *, timeout_s: float = 120.0, **kwargs) -> list[dict]:
    """distributed_rank on `world_size` gloo processes with `optimizer` (a class).

    The ranks are fresh processes. A class they can import (from a module, or from a notebook the course's
    loader ran) is passed by name; one defined in a Jupyter cell is passed as the source of the notebook's
    imports, functions and classes. Only anything else (a class defined inside a function) reaches the
    ranks in forked copies of this process, which works on CPU-only machines.
    """
    return _launch_ranks(optimizer, world_size, distributed_rank, "memfit.zero:distributed_rank", timeout_s,
                         dict(stage=stage, **kwargs))


def run_distributed_stages(optimizer, world_size: int, stages=(0, 1, 2, 3), *, timeout_s: float = 240.0,
                           **kwargs) -> dict[int, list[dict]]:
    """run_distributed for several stages, one after another in the same `world_size` processes:
    {stage: each rank's result}. One launch instead of one per stage (starting a process that imports
    torch takes seconds); each stage trains from scratch, as run_distributed does."""
    stages = [int(s) for s in stages]
    ranks = _launch_ranks(optimizer, world_size, distributed_stages_rank, "memfit.zero:distributed_stages_rank",
                          timeout_s, dict(stages=stages, **kwargs))
    return {stage: [r[i] for r in ranks] for i, stage in enumerate(stages)}


def _launch_ranks(optimizer, world_size: int, fn, target: str, timeout_s: float, kwargs: dict) -> list:
    from memfit.dist import importable_name, interactive_definitions, run_ranks
    name = importable_name(optimizer)
    if name is None and "<locals>" not in optimizer.__qualname__:
        source = interactive_definitions()  # a Jupyter cell's class: the ranks run the notebook's definitions
        if source is not None:
            name = {"source": source, "name": optimizer.__qualname__}
    args = dict(optimizer=name or optimizer, **kwargs)
    try:
        # The rank server imports this module before it forks the ranks: they start with it (and torch) imported.
        return run_ranks(target if name else fn, world_size, args=args, timeout_s=timeout_s, preload=("memfit.zero",))
    except Exception as exc:
        if "Autograd-and-Fork" in str(exc):
            raise RuntimeError(
                "the ranks are forked copies of this process, and this process already ran a backward pass "
                "with autograd's GPU threads, which a fork cannot carry. Restart the kernel and run this cell "
                "before any other backward pass, or grade the saved notebook (make grade)") from None
        raise


def max_relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|: one number for a whole parameter vector."""
    return ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30)).item()


def engine_peak_bytes(stage: int, numel: int, world_size: int, param_bytes: int = 4, grad_bytes: int = 4) -> dict:
    """The transient bytes of a train_ranks step with lesson 03's reference ZeroAdamW, moment by moment, on
    top of the states at rest (activations and the loss's temporaries excluded: they depend on the batch).

    end of backward: the per-parameter gradients and their flat copy (2·G·Ψ), with ZeRO-3's gathered vector;
    reduction: the local gradient, the padded copy stages 2-3 reduce-scatter, stage 1's reduced shard;
    AdamW: the local gradient, stage 1's reduced shard, an fp32 copy of the gradient shard under mixed
    precision, and the two temporaries of torch's single-tensor AdamW (sqrt(v), then its scaling);
    parameter all-gather (stages 1-2): the local gradient and the copy of the rank's shard it sends.
    Collectives are taken to write in place, as NCCL's and gloo's do; simulate()'s threads also
    allocate the summed chunk and the concatenated shards, which this does not count.
    """
    shard = -(-numel // world_size)
    padded = shard * world_size
    updated = padded if stage == 0 else shard  # elements this rank's AdamW updates
    mixed = param_bytes != 4
    local = grad_bytes * numel
    moments = {
        "end of backward": 2 * local + (param_bytes * padded if stage == 3 else 0),
        "reduction": local + (grad_bytes * padded if stage >= 2 else 0) + (grad_bytes * shard if stage == 1 else 0),
        "optimizer step": local + (grad_bytes * shard if stage == 1 else 0) + (4 * updated if mixed else 0)
                          + 2 * 4 * updated,
        "parameter all-gather": local + (param_bytes * shard if stage in (1, 2) else 0),
    }
    moment = max(moments, key=moments.get)
    return {"transient": moments[moment], "moment": moment, "moments": moments}


# ------------------------------------------------------------------------ on torch.distributed

def distributed_rank(rank: int, world_size: int, optimizer: str | type, stage: int, steps: int = 2,
                     cfg: str = "tiny", batch: int = 2, seq: int = 16, param_dtype: str = "float32",
                     opt_args: dict | None = None, device: str = "cpu") -> dict:
    """One rank of train_ranks on torch.distributed (run it with memfit.dist.run_ranks or torchrun).
    optimizer: the class, or where to find it ("mypackage.zero:ZeroAdamW", "x.ipynb::ZeroAdamW").
    Rank 0 also trains the unsharded reference and reports the largest relative difference."""
    if isinstance(optimizer, (str, dict)):
        from memfit.dist_rank import resolve
        optimizer = resolve(optimizer)
    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    report = train_ranks(optimizer, TorchComm(), stage, cfg=cfg, steps=steps, batch=batch, seq=seq,
                         param_dtype=getattr(torch, param_dtype), device=device, opt_args=opt_args)
    out = dict(rank=rank, buffers=report.buffers, at_rest=report.at_rest, peak=report.peak,
               sent_per_step=report.sent_per_step, cublas_workspace=report.workspace)
    if rank == 0 and param_dtype == "float32":
        want = reference_training(world_size, cfg=cfg, steps=steps, batch=batch, seq=seq, opt_args=opt_args,
                                  device=device)
        out["max_rel_error"] = max_relative_error(report.final, want)
        out["bitwise_equal"] = bool(torch.equal(report.final, want))
    return out


def distributed_stages_rank(rank: int, world_size: int, optimizer: str | type, stages: list[int],
                            **kwargs) -> list[dict]:
    """distributed_rank for each of `stages` in turn, in this one process group: a list, one result per stage.
    Each stage is announced on stdout first, so a rank that hangs or fails is reported with its stage."""
    if isinstance(optimizer, (str, dict)):
        from memfit.dist_rank import resolve
        optimizer = resolve(optimizer)  # once: a notebook's definitions are not run again for every stage
    out = []
    for stage in stages:
        print(f"rank {rank}: stage {stage}", flush=True)
        try:
            out.append(distributed_rank(rank, world_size, optimizer, stage, **kwargs))
        except Exception as exc:
            raise RuntimeError(f"stage {stage} failed on rank {rank}: {type(exc).__name__}: {exc}") from exc
    return out


# ------------------------------------------------------------- PyTorch's own engines, for comparison

def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor's shard on this rank


def held_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (a DTensor counts its local shard)."""
    seen, total = set(), 0
    for t in tensors:
        t = _local(t)
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen and storage.nbytes():
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def _engine_inventory(model, opt) -> dict[str, int]:
    params = list({id(p): p for p in model.parameters()}.values())
    local = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps its shard's states in .optim
    states = [v for s in local.state.values() for k, v in s.items() if k != "step" and torch.is_tensor(v)]
    return {"params": held_bytes(params), "grads": held_bytes([p.grad for p in params if p.grad is not None]),
            "optimizer": held_bytes(states)}


def _train_engine(rank, world_size, wrap, make_opt, *, cfg, steps, batch, seq, opt_args, device, seed=0):
    """Train the course GPT wrapped by `wrap` (FSDP2, DDP) on the same batches as train_ranks."""
    cfg = COURSE_CONFIGS[cfg] if isinstance(cfg, str) else cfg
    dev = torch.device(f"cuda:{torch.cuda.current_device()}" if device == "cuda" else device)
    with open_meter(dev, stat="allocated") as meter:
        with _GLOBAL_RNG:
            torch.manual_seed(seed)
            with torch.device(dev):
                model = GPT(cfg)
        model = wrap(model, dev)
        opt = make_opt(model, dict(opt_args or {}))
        for step in range(steps):
            idx, targets = rank_batch(cfg, step, rank, batch, seq, dev)
            if step == steps - 1:
                meter.reset_peak()
            opt.zero_grad(set_to_none=False)  # gradients stay allocated between steps, as in train_ranks
            model(idx, targets).backward()
            opt.step()
            del idx, targets
        gc.collect()
        at_rest, peak = meter.current, meter.peak
    out = dict(rank=rank, inventory=_engine_inventory(model, opt), at_rest=at_rest, peak=peak,
               cublas_workspace=meter.workspace)
    full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach() for n, p in model.named_parameters()}
    flat_model = FlatModel.of(cfg)
    final = torch.cat([full[_strip(n, full)].reshape(-1).float() for n in flat_model.names])
    if rank == 0:
        want = reference_training(world_size, cfg=cfg, steps=steps, batch=batch, seq=seq, opt_args=opt_args,
                                  seed=seed, device=dev)
        out["max_rel_error"] = max_relative_error(final, want)
        out["bitwise_equal"] = bool(torch.equal(final, want))
    return out


def _strip(name: str, full: dict) -> str:
    """A FlatModel name as the wrapped model spells it (DDP prefixes "module.")."""
    return name if name in full else f"module.{name}"


def fsdp2_rank(rank: int, world_size: int, steps: int = 2, cfg: str = "tiny", batch: int = 2, seq: int = 16,
               opt_args: dict | None = None, device: str = "cpu", per_block: bool = True) -> dict:
    """One rank of the course GPT under FSDP2's fully_shard (ZeRO-3), each block its own unit when
    per_block, with torch.optim.AdamW; on CPU the device mesh is a CPU mesh over gloo."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def wrap(model, dev):
        mesh = init_device_mesh(dev.type, (world_size,))
        if per_block:
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    def make_opt(model, args):
        return torch.optim.AdamW(model.parameters(), foreach=False, **args)

    return _train_engine(rank, world_size, wrap, make_opt, cfg=cfg, steps=steps, batch=batch, seq=seq,
                         opt_args=opt_args, device=device)


def zero_redundancy_rank(rank: int, world_size: int, steps: int = 2, cfg: str = "tiny", batch: int = 2,
                         seq: int = 16, opt_args: dict | None = None, device: str = "cpu") -> dict:
    """One rank of DDP with torch's ZeroRedundancyOptimizer (ZeRO-1): whole parameters are dealt to
    ranks, so the optimizer's shards are as even as the parameter sizes allow."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    def wrap(model, dev):
        return DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None, gradient_as_bucket_view=True)

    def make_opt(model, args):
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, foreach=False, **args)

    return _train_engine(rank, world_size, wrap, make_opt, cfg=cfg, steps=steps, batch=batch, seq=seq,
                         opt_args=opt_args, device=device)


ENGINES = {"ZeroRedundancyOptimizer (ZeRO-1)": ("zero_redundancy_rank", 1),
           "FSDP2 fully_shard (ZeRO-3)": ("fsdp2_rank", 3)}  # name: (rank function in this module, ZeRO stage)


def engines_rank(rank: int, world_size: int, **kwargs) -> dict[str, dict]:
    """One rank of each of PyTorch's engines in ENGINES, one after another in this process group:
    {engine name: what its rank function returns}. One launch for both (a process that imports torch takes
    seconds to start)."""
    return {name: globals()[fn](rank, world_size, **kwargs) for name, (fn, _) in ENGINES.items()}


def main(argv=None) -> int:
    """Entry point for torchrun:
    torchrun --standalone --nproc-per-node 2 -m memfit.zero --stage 3 --optimizer lessons/03_zero.ipynb::ZeroAdamW"""
    import argparse
    import json
    import os

    import torch.distributed as dist

    parser = argparse.ArgumentParser(description="Train the course GPT with a ZeRO optimizer on torchrun's ranks.")
    parser.add_argument("--stage", type=int, default=3, choices=(0, 1, 2, 3))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--cfg", default="tiny", choices=sorted(COURSE_CONFIGS))
    parser.add_argument("--optimizer", required=True,
                        help='the ZeRO optimizer: "module:Class" or "notebook.ipynb::Class" (make zero-torchrun '
                             'passes lesson 03\'s, or OPTIMIZER=...)')
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("run me under torchrun, e.g. torchrun --standalone --nproc-per-node 2 -m memfit.zero "
                     "--optimizer lessons/03_zero.ipynb::ZeroAdamW (or make zero-torchrun)")
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    try:
        result = distributed_rank(dist.get_rank(), dist.get_world_size(), args.optimizer, args.stage,
                                  steps=args.steps, cfg=args.cfg, device=args.device,
                                  opt_args=dict(lr=1e-2, eps=1e-3, weight_decay=0.1))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # One write per line (under PIPE_BUF bytes): lines of ranks sharing a pipe do not interleave.
    os.write(1, f"rank {result['rank']}: {json.dumps(result)}\n".encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
