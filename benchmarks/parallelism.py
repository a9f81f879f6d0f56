"""Lesson 09 benchmark on 2 and 4 GPUs (NCCL): per-rank memory of TP + SP, CP and PP against the lesson's counts.

What tensor + sequence, context and pipeline parallelism keep per rank on the course's medium GPT in bf16, against the
lesson's predictions, with PyTorch's own tensor parallelism beside ours.

Four parts, each on a fresh set of processes (one per GPU, memfit.dist.run_ranks with NCCL), on 2 GPUs and on 4:

  tp        the reference tp_block of solutions/09_parallelism.ipynb (memfit.from_lessons.parallelism) on a stack of
            the config's n_layers blocks, each rank holding shard_block's shard of every block, x of (seq, batch,
            d_model): with sequence parallelism (Megatron's all-gather / reduce-scatter) and without (all-reduces).
            Predicted: n_layers x tp_activation_bytes(cfg, seq, batch, tp, sp, "none", 2).
  torch_tp  PyTorch's tensor parallelism on the same weights: parallelize_module with ColwiseParallel, RowwiseParallel,
            SequenceParallel and PrepareModuleInput (torchtitan's Llama plan, in the (seq, batch, d_model) layout, so
            Shard(0)). The course block fuses wqkv and w13; ColwiseParallel splits a weight's rows contiguously, which
            for a fused matrix would hand rank 0 query heads only (lesson exercise 2), so this block has separate wq,
            wk, wv and w1 (gate), w3 (up), the same values split, as torchtitan has. Same prediction.
  cp        context parallelism: each rank holds cp_positions' tokens (the load-balanced zigzag) of every activation;
            the block is the course block with attention replaced by the reference ring_attention (K and V passed
            with TorchComm.ring_pass), RoPE at the rank's positions (rope_sbh(..., positions=...)). K and V are
            repeated to the query heads before the ring (ring_attention takes q, k, v of one shape), so the ring
            carries n_heads / n_kv_heads times grouped-query attention's K and V. ring_attention saves what SDPA
            saves (q, k, v, its output and an fp32 log-sum-exp per query and head), so the prediction is
            n_layers x tp_activation_bytes(cfg, seq // cp, batch, 1, False, "none", 2). Read after one more P2P
            call: NCCL can hold the last ring_pass's send and receive buffers until the rank's next P2P call (a
            collective, or seconds of waiting, do not release them); what that call frees is shown as "held".
  pp        torch.distributed.pipelining's ScheduleGPipe and Schedule1F1B on the config's blocks cut into as many
            stages as GPUs (memfit.parallel.PipelineStageModule, stage_layers), 8 micro-batches. Predicted peak of
            stage s: in_flight[s] (the lesson's pipeline_schedule) x what one micro-batch's forward keeps there
            (layers x tp_activation_bytes(cfg, seq, micro_batch, 1, False): the stage's input is a persistent receive
            buffer, or a view of the batch on stage 0, while its output is kept for backward, the same bytes), plus
            the last stage's loss (its fp32 (y - target), which pow saves), plus the stage's weight gradients
            (allocated, zeroed, at the start of the measured step, as a persistent gradient buffer is), plus smaller
            named terms: the last stage's fp32 losses, and its outputs where the installed schedule cannot be told
            not to return them; stage 0's first norm's 1/rms, not saved since its input needs no gradient; under
            1F1B, the last P2P tensors the schedule's loop still references (the input gradient it sent back, in
            `bwd_sends`, on stage > 0; a warm-up output, in `send_work`'s Work, on stage < last, where the
            backend's Work holds its tensor, as gloo's does). What backward adds on top (one micro-batch's
            transient) is measured alone, on the stage's module, and shown beside.

Memory is measured on every rank with memfit.meter.open_meter: the CUDA allocator's requested bytes on a GPU (cuBLAS's
workspace created before and reported apart), live tensors on a CPU. The meter is entered after the warm-up and timed
steps, with the weights' gradients dropped: "kept after forward" is what is alive after the forward, less the
output, plus the input (what backward needs, the input included: the lesson's definition), read after every rank has
finished its collectives; "saved" counts the same from the distinct storages autograd saves for backward (a
DTensor's local shard), a second route to the figure; "peak" is the most alive during forward + backward, the
gradients included. Step times: the median of CUDA events around forward + backward (a pipeline's whole step), after
warm-up steps, the slowest rank's.
A rank also compares its output with the unsharded blocks (memfit.parallel.full_block) on the same weights: the
largest difference relative to the largest value, bf16 rounding.

    python -m benchmarks.parallelism                         # 2+ GPUs: benchmarks/results/<device> xN-<date>-parallelism.*
    python -m benchmarks.parallelism --parts tp cp --worlds 2  # some parts, some world sizes (recorded with a suffix)
    python -m benchmarks.parallelism --cpu-smoke               # gloo and a tiny config: the logic, on any machine
"""
from __future__ import annotations

import argparse
import gc
import inspect
import statistics
import sys
import time

import memfit  # noqa: F401  (before triton: it decides TRITON_INTERPRET)
import torch
from torch import nn

from memfit.from_lessons.parallelism import (pipeline_schedule, ring_attention, shard_block, tp_activation_bytes,
                                             tp_block)
from memfit.gpt import COURSE_CONFIGS, GPTConfig, RMSNorm, apply_rope, rms_norm, swiglu
from memfit.parallel import PipelineStageModule, block_params, cp_positions, full_block, rope_sbh, stage_layers

MODEL, DTYPE = "medium", "bfloat16"
SEQ, BATCH = 4096, 1  # tokens of x, and sequences: TP, TP + SP and CP (one sequence: SDPA's output then needs no copy)
PP_MICRO_BATCH, N_MICRO = 1, 8  # the pipeline: 8 micro-batches of 1 x SEQ tokens
WARMUP, STEPS = 3, 10
PARTS = ("tp", "torch_tp", "cp", "pp")
TIMEOUT_S = 300  # per launch (one part on one world size)
# --cpu-smoke: gloo ranks on a CPU, a config every part and world size (2, 4) can split: 8 heads, 4 kv heads, 4 layers.
SMOKE_CONFIG = dict(vocab_size=256, d_model=128, n_layers=4, n_heads=8, n_kv_heads=4, ffn_hidden=256, max_seq_len=256,
                    name="smoke")
SMOKE = dict(seq=64, batch=1, pp_seq=32, warmup=1, steps=2)


# ------------------------------------------------------------------------------------------- inside a rank

def _config(cfg) -> GPTConfig:
    return COURSE_CONFIGS[cfg] if isinstance(cfg, str) else GPTConfig(**cfg)


def _device() -> torch.device:
    import torch.distributed as dist
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _settle(comm, device: torch.device) -> None:
    """Every rank past its collectives (and their buffers released), garbage collected: before reading a meter."""
    _sync(device)
    comm.settle()
    gc.collect()


def _current(meter, device: torch.device) -> int:
    """The meter's count once it stops moving: a backend can release a collective's buffers a moment after the
    collective returns (NCCL's watchdog, gloo's worker thread)."""
    now = meter.current
    for _ in range(10):
        time.sleep(0.1 if device.type == "cuda" else 0.02)
        gc.collect()
        again = meter.current
        if again == now:
            break
        now = again
    return now


def _step_ms(step, device: torch.device, comm, warmup: int, steps: int) -> float:
    """Median milliseconds of step() after `warmup` calls, the ranks started together before each."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        _sync(device)
        comm.settle()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _storage_of(t: torch.Tensor):
    """(key, bytes) of the storage under t: a DTensor's local shard's (an AsyncCollectiveTensor's result's)."""
    while True:
        inner = getattr(t, "_local_tensor", None)
        if inner is None and type(t).__name__ == "AsyncCollectiveTensor":
            inner = getattr(t, "elem", None)
        if not isinstance(inner, torch.Tensor):
            break
        t = inner
    try:
        storage = t.untyped_storage()
        return (str(t.device), storage.data_ptr()), storage.nbytes()
    except Exception:  # a wrapper with no storage of its own: its elements, once
        return ("unreadable", id(t)), t.numel() * t.element_size()


class _SavedForBackward:
    """Bytes of the distinct storages autograd saves for backward while it is entered (a DTensor's local shard),
    leaving out those of `existing` tensors (the weights, RoPE's tables, the input): a second count of what forward
    keeps, by another route than the meter's (and one that sees inside DTensors, which the CPU meter does not)."""

    def __init__(self, existing) -> None:
        self.existing = {_storage_of(t)[0] for t in existing}
        self.saved: dict = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t):
        key, nbytes = _storage_of(t)
        if key not in self.existing:
            self.saved[key] = nbytes
        return t

    @property
    def unreadable(self) -> int:
        return sum(1 for key in self.saved if key[0] == "unreadable")

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(self.saved.values())


def _measure(forward, inputs: torch.Tensor, existing, backward, zero_grads, device: torch.device, comm,
             release=None) -> dict:
    """One forward + backward under the meter, from no gradients: kept after forward (alive - output + input), the
    same counted from what autograd saves (+ the input), the peak of the whole step, what is alive after it (the
    gradients), and the workspace the meter created first.

    release: a call that makes the backend drop what it still references of finished collectives (a P2P call: NCCL
    can hold the last point-to-point batch's tensors until this rank's next one); kept_released is read after it."""
    from memfit.meter import open_meter
    input_bytes = inputs.untyped_storage().nbytes()
    zero_grads()
    _settle(comm, device)
    with open_meter(device) as meter:
        meter.reset_peak()  # (a CUDA meter's peak is the process's since its last reset)
        with _SavedForBackward([inputs, *existing]) as saved:
            out = forward()
        _settle(comm, device)
        kept = _current(meter, device) - out.untyped_storage().nbytes() + input_bytes
        kept_released = kept
        if release is not None:
            release()
            _settle(comm, device)
            kept_released = _current(meter, device) - out.untyped_storage().nbytes() + input_bytes
        output_bytes = out.untyped_storage().nbytes()
        backward(out)
        del out
        _settle(comm, device)
        return dict(kept=kept, kept_released=kept_released, saved=saved.bytes + input_bytes,
                    saved_unreadable=saved.unreadable, peak=meter.peak,
                    after_backward=_current(meter, device), output_bytes=output_bytes, workspace=meter.workspace)


def _inputs(cfg: GPTConfig, seq: int, batch: int, dtype, device):
    """x and the output's gradient dy, (seq, batch, d_model), the same on every rank."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(seq, batch, cfg.d_model, generator=g).to(device=device, dtype=dtype)
    dy = torch.randn(seq, batch, cfg.d_model, generator=g).to(device=device, dtype=dtype)
    return x, dy


def _all_params(cfg: GPTConfig, dtype, device) -> list[dict]:
    """Every block's weights (block_params, seed = the layer), the same on every rank."""
    return [block_params(cfg, seed=layer, dtype=dtype, device=device) for layer in range(cfg.n_layers)]


@torch.no_grad()
def _reference(x: torch.Tensor, params: list[dict], cfg: GPTConfig, rope) -> torch.Tensor:
    """The unsharded blocks (memfit.parallel.full_block) on the whole sequence."""
    for p in params:
        x = full_block(x, p, cfg, rope)
    return x


def _rel_diff(out: torch.Tensor, want: torch.Tensor) -> float:
    out, want = out.detach().float(), want.float()
    return float((out - want).abs().max() / want.abs().max().clamp_min(1e-30))


def tp_rank(rank: int, world_size: int, cfg, seq: int, batch: int, dtype: str, warmup: int, steps: int) -> dict:
    """The reference tp_block on a stack of n_layers blocks, with and without sequence parallelism."""
    from memfit.zero import TorchComm
    cfg, dtype, device, comm = _config(cfg), getattr(torch, dtype), _device(), TorchComm()
    e = torch.finfo(dtype).bits // 8
    x, dy = _inputs(cfg, seq, batch, dtype, device)
    rope = rope_sbh(cfg, seq, dtype, device)
    params = _all_params(cfg, dtype, device)
    want = _reference(x, params, cfg, rope)
    shards = [{k: v.requires_grad_() for k, v in shard_block(p, cfg, world_size, rank).items()} for p in params]
    del params
    weights = [t for shard in shards for t in shard.values()]
    rows = slice(rank * seq // world_size, (rank + 1) * seq // world_size)
    out = {}
    for sp in (True, False):
        mine = (x[rows] if sp else x).clone().requires_grad_()
        grad = (dy[rows] if sp else dy).clone()

        def forward():
            y = mine
            for shard in shards:
                y = tp_block(y, shard, cfg, comm, rope, sp)
            return y

        def zero_grads():
            mine.grad = None
            for t in weights:
                t.grad = None

        def step():
            zero_grads()
            forward().backward(grad)
        ms = _step_ms(step, device, comm, warmup, steps)
        sent = comm.sent_bytes
        m = _measure(forward, mine, [*weights, *rope], lambda y: y.backward(grad), zero_grads, device, comm)
        m["sent_per_step"] = comm.sent_bytes - sent
        with torch.no_grad():
            m["max_rel_diff"] = _rel_diff(forward(), want[rows] if sp else want)
        m.update(step_ms=ms, weight_grads=sum(t.nbytes for t in weights),
                 predicted=cfg.n_layers * tp_activation_bytes(cfg, seq, batch, world_size, sp, "none", e))
        out["TP + SP" if sp else "TP"] = m
        del mine, grad
    return out


# -------------------------------------------------------------------------------- PyTorch's tensor parallelism

def _linear(w: torch.Tensor) -> nn.Linear:
    """nn.Linear holding w (out, in): ColwiseParallel and RowwiseParallel take nn.Linear modules only."""
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
    lin.weight = nn.Parameter(w.detach().clone())
    return lin


def _norm(w: torch.Tensor, eps: float) -> RMSNorm:
    norm = RMSNorm(w.shape[0], eps)
    norm.weight = nn.Parameter(w.detach().clone())
    return norm


class TorchTPAttention(nn.Module):
    """The course block's attention on (seq, batch, d_model), q, k and v projected apart: under ColwiseParallel each
    projection's output is this rank's heads (the rows rank r holds of wq are query heads r·n_heads/t ..., of wk
    and wv kv heads r·n_kv_heads/t ...: the same heads shard_block gives it)."""

    def __init__(self, cfg: GPTConfig, p: dict):
        super().__init__()
        self.head_dim = cfg.head_dim
        wq, wk, wv = p["wqkv"].split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim])
        self.wq, self.wk, self.wv, self.wo = (_linear(w) for w in (wq, wk, wv, p["wo"]))

    def forward(self, x, cos, sin):
        s, b, d = x.shape[0], x.shape[1], self.head_dim
        q, k, v = self.wq(x), self.wk(x), self.wv(x)  # local tensors: the rank's heads, every token
        heads, kv_heads = q.shape[-1] // d, k.shape[-1] // d
        q = apply_rope(q.view(s, b, heads, d), cos, sin)
        k = apply_rope(k.view(s, b, kv_heads, d), cos, sin).repeat_interleave(heads // kv_heads, dim=2)
        v = v.view(s, b, kv_heads, d).repeat_interleave(heads // kv_heads, dim=2)
        y = torch.nn.functional.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)), is_causal=True)
        return self.wo(y.permute(2, 0, 1, 3).reshape(s, b, heads * d))


class TorchTPMLP(nn.Module):
    """SwiGLU with gate (w1) and up (w3) apart, torchtitan's names."""

    def __init__(self, cfg: GPTConfig, p: dict):
        super().__init__()
        gate, up = p["w13"].chunk(2)
        self.w1, self.w3, self.w2 = _linear(gate), _linear(up), _linear(p["w2"])

    def forward(self, x):
        return self.w2(swiglu(self.w1(x), self.w3(x)))


class TorchTPBlock(nn.Module):
    """memfit.parallel.full_block as modules, for parallelize_module."""

    def __init__(self, cfg: GPTConfig, p: dict):
        super().__init__()
        self.norm1, self.norm2 = _norm(p["norm1"], cfg.norm_eps), _norm(p["norm2"], cfg.norm_eps)
        self.attn, self.mlp = TorchTPAttention(cfg, p), TorchTPMLP(cfg, p)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


def torch_tp_plan(sequence_parallel: bool) -> dict:
    """torchtitan's plan for a Llama block, the sequence on dim 0: norms sequence-parallel, one all-gather (or, without
    SP, one conversion) before q, k and v and one before gate and up, the row-parallel outputs reduce-scattered back
    to the rank's tokens (all-reduced without SP)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)
    stream = Shard(0) if sequence_parallel else Replicate()
    plan = {"attn": PrepareModuleInput(input_layouts=(stream, None, None), desired_input_layouts=(Replicate(), None, None)),
            "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=stream),
            "mlp": PrepareModuleInput(input_layouts=(stream,), desired_input_layouts=(Replicate(),)),
            "mlp.w1": ColwiseParallel(), "mlp.w3": ColwiseParallel(), "mlp.w2": RowwiseParallel(output_layouts=stream)}
    if sequence_parallel:
        plan.update(norm1=SequenceParallel(sequence_dim=0), norm2=SequenceParallel(sequence_dim=0))
    return plan


def _local_bytes(t: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor
    return (t.to_local() if isinstance(t, DTensor) else t).nbytes


def torch_tp_rank(rank: int, world_size: int, cfg, seq: int, batch: int, dtype: str, warmup: int, steps: int) -> dict:
    """PyTorch's parallelize_module on the same blocks, with and without SequenceParallel."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    from memfit.zero import TorchComm
    cfg, dtype, device, comm = _config(cfg), getattr(torch, dtype), _device(), TorchComm()
    e = torch.finfo(dtype).bits // 8
    mesh = init_device_mesh(device.type, (world_size,))
    x, dy = _inputs(cfg, seq, batch, dtype, device)
    cos, sin = rope_sbh(cfg, seq, dtype, device)
    params = _all_params(cfg, dtype, device)
    want = _reference(x, params, cfg, (cos, sin))
    rows = slice(rank * seq // world_size, (rank + 1) * seq // world_size)
    out = {}
    for sp in (True, False):
        blocks = nn.ModuleList(TorchTPBlock(cfg, p) for p in params)
        for block in blocks:
            parallelize_module(block, mesh, torch_tp_plan(sp))
        weights = list(blocks.parameters())
        mine = (x[rows] if sp else x).clone().requires_grad_()
        grad = (dy[rows] if sp else dy).clone()

        def forward():
            y = mine
            for block in blocks:
                y = block(y, cos, sin)
            return y

        def zero_grads():
            mine.grad = None
            blocks.zero_grad(set_to_none=True)

        def step():
            zero_grads()
            forward().backward(grad)
        ms = _step_ms(step, device, comm, warmup, steps)
        m = _measure(forward, mine, [*weights, cos, sin], lambda y: y.backward(grad), zero_grads, device, comm)
        with torch.no_grad():
            m["max_rel_diff"] = _rel_diff(forward(), want[rows] if sp else want)
        m.update(step_ms=ms, weight_grads=sum(_local_bytes(w) for w in weights),
                 predicted=cfg.n_layers * tp_activation_bytes(cfg, seq, batch, world_size, sp, "none", e))
        out["TP + SP" if sp else "TP"] = m
        del blocks, weights, mine, grad
        gc.collect()
    return out


# --------------------------------------------------------------------------------------------- context parallelism

def cp_block(x: torch.Tensor, p: dict, cfg: GPTConfig, comm, rope) -> torch.Tensor:
    """The course block on rank comm.rank's tokens (cp_positions order), attention by ring_attention over the
    whole sequence: (seq / cp, batch, d_model) in and out."""
    s, b, _ = x.shape
    cos, sin = rope
    h, kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q, k, v = (rms_norm(x, p["norm1"], cfg.norm_eps) @ p["wqkv"].T).split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim], dim=-1)
    q = apply_rope(q.reshape(s, b, h, d), cos, sin)
    k = apply_rope(k.reshape(s, b, kv, d), cos, sin).repeat_interleave(h // kv, dim=2)
    v = v.reshape(s, b, kv, d).repeat_interleave(h // kv, dim=2)
    x = x + ring_attention(q, k, v, comm).reshape(s, b, cfg.q_dim) @ p["wo"].T
    gate, up = (rms_norm(x, p["norm2"], cfg.norm_eps) @ p["w13"].T).chunk(2, dim=-1)
    return x + swiglu(gate, up) @ p["w2"].T


def cp_rank(rank: int, world_size: int, cfg, seq: int, batch: int, dtype: str, warmup: int, steps: int) -> dict:
    """A stack of cp_blocks on the rank's seq / cp tokens."""
    from memfit.zero import TorchComm
    cfg, dtype, device, comm = _config(cfg), getattr(torch, dtype), _device(), TorchComm()
    e = torch.finfo(dtype).bits // 8
    x, dy = _inputs(cfg, seq, batch, dtype, device)
    params = _all_params(cfg, dtype, device)
    positions = cp_positions(seq, world_size, rank).to(device)
    want = _reference(x, params, cfg, rope_sbh(cfg, seq, dtype, device))[positions]
    rope = rope_sbh(cfg, seq, dtype, device, positions=positions)
    for p in params:
        for t in p.values():
            t.requires_grad_()
    weights = [t for p in params for t in p.values()]
    mine, grad = x[positions].clone().requires_grad_(), dy[positions].clone()
    del x, dy

    def forward():
        y = mine
        for p in params:
            y = cp_block(y, p, cfg, comm, rope)
        return y

    def zero_grads():
        mine.grad = None
        for t in weights:
            t.grad = None

    def step():
        zero_grads()
        forward().backward(grad)
    ms = _step_ms(step, device, comm, warmup, steps)
    sent = comm.sent_bytes
    one = torch.zeros(1, device=device)  # the release's message: made before the meter, 4 bytes back

    def release():  # NCCL can hold the last ring_pass's send and receive buffers until this rank's next P2P call
        comm.ring_pass(one)
    m = _measure(forward, mine, [*weights, *rope], lambda y: y.backward(grad), zero_grads, device, comm, release)
    m["sent_per_step"] = comm.sent_bytes - sent - one.nbytes * (world_size > 1)
    m["message"] = 2 * (seq // world_size) * batch * cfg.n_heads * cfg.head_dim * e  # K and V, stacked
    with torch.no_grad():
        m["max_rel_diff"] = _rel_diff(forward(), want)
    m.update(step_ms=ms, weight_grads=sum(t.nbytes for t in weights), tokens=seq // world_size,
             predicted=cfg.n_layers * tp_activation_bytes(cfg, seq // world_size, batch, 1, False, "none", e))
    return m


# ---------------------------------------------------------------------------------------- pipeline parallelism

def _pp_loss(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (y.float() - target).pow(2).mean()


def _one_micro_batch(module, first: bool, last: bool, x, target, micro_batch: int, device, comm) -> dict:
    """One micro-batch through this stage's module alone, its gradients already there: what its forward keeps (its
    input included), what the last stage's loss keeps, and the transient of its backward (peak - alive before)."""
    from memfit.meter import open_meter
    micro = x[:micro_batch].clone()
    if not first:  # a received activation: its gradient is sent back
        micro.requires_grad_()
    dy = None if last else torch.randn_like(micro)  # a received gradient lives in a persistent buffer
    _settle(comm, device)
    with open_meter(device) as meter:
        meter.reset_peak()  # (a CUDA meter's peak is the process's since its last reset)
        out = module(micro)
        _settle(comm, device)
        kept = _current(meter, device) - out.untyped_storage().nbytes() + micro.untyped_storage().nbytes()
        loss_kept = 0
        if last:
            before = meter.current
            loss = _pp_loss(out, target[:micro_batch])
            loss_kept = meter.current - before
            root, grad = loss, None
        else:
            root, grad = out, dy
        del out
        before = meter.current
        meter.reset_peak()
        root.backward(grad)
        del root
        _settle(comm, device)
        transient = meter.peak - before
    return dict(kept=kept, loss_kept=loss_kept, transient=transient)


def pp_rank(rank: int, world_size: int, cfg, seq: int, micro_batch: int, n_micro: int, dtype: str, warmup: int,
            steps: int) -> dict:
    """This rank's stage of the blocks under ScheduleGPipe and Schedule1F1B: the peak of a step, its time, and the
    parts of the prediction."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from memfit.meter import open_meter
    from memfit.zero import TorchComm
    cfg, dtype, device, comm = _config(cfg), getattr(torch, dtype), _device(), TorchComm()
    e = torch.finfo(dtype).bits // 8
    layers = stage_layers(cfg.n_layers, world_size, rank)
    module = PipelineStageModule(cfg, layers, seq, device).to(dtype)  # its RoPE tables too: no cast per block
    first, last = rank == 0, rank == world_size - 1
    g = torch.Generator().manual_seed(0)
    x = torch.randn(micro_batch * n_micro, seq, cfg.d_model, generator=g).to(device=device, dtype=dtype)
    target = torch.randn(micro_batch * n_micro, seq, cfg.d_model, generator=g).to(device)
    weights = list(module.parameters())
    grads = sum(w.nbytes for w in weights)
    per_micro_batch = len(layers) * tp_activation_bytes(cfg, seq, micro_batch, 1, False, "none", e)
    output_bytes = micro_batch * seq * cfg.d_model * e
    loss_bytes = micro_batch * seq * cfg.d_model * 4 if last else 0  # (y.float() - target), saved by pow
    out = dict(stage=rank, layers=len(layers), weight_grads=grads, per_micro_batch_predicted=per_micro_batch,
               loss_predicted=loss_bytes, schedules={})
    for name, schedule in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        stage = PipelineStage(module, rank, world_size, device)
        runner = schedule(stage, n_microbatches=n_micro, loss_fn=_pp_loss)
        returns = "return_outputs" not in inspect.signature(runner.step).parameters
        kwargs = {} if returns else {"return_outputs": False}  # else the last stage keeps every micro-batch's output

        def step():
            if first:
                runner.step(x, **kwargs)
            elif last:
                runner.step(target=target, losses=[], **kwargs)
            else:
                runner.step(**kwargs)

        def fresh_step():
            module.zero_grad(set_to_none=True)
            step()
        ms = _step_ms(fresh_step, device, comm, warmup, steps)
        module.zero_grad(set_to_none=True)
        _settle(comm, device)
        with open_meter(device) as meter:
            meter.reset_peak()  # (a CUDA meter's peak is the process's since its last reset)
            for w in weights:  # the gradients exist for the whole step, as a persistent gradient buffer does
                w.grad = torch.zeros_like(w)
            step()
            _settle(comm, device)
            peak = meter.peak
        in_flight = pipeline_schedule(world_size, n_micro, name)["in_flight"][rank]
        terms = dict(activations=in_flight * per_micro_batch, loss=in_flight * loss_bytes, weight_grads=grads,
                     # ScheduleGPipe and Schedule1F1B return the last stage's outputs unless told not to
                     outputs_returned=(n_micro - in_flight) * output_bytes if returns and last else 0,
                     # the losses of every micro-batch, fp32 scalars
                     losses=4 * n_micro if last else 0,
                     # stage 0's input needs no gradient: its first norm's 1/rms (one value a token) is not saved
                     first_input=-in_flight * micro_batch * seq * e if first else 0,
                     # 1F1B's loop keeps its last P2P ops referenced past their use: the input gradient sent back
                     # (stage > 0: the P2POp list `bwd_sends`) and the output of warm-up forward w - 2 (stage < last:
                     # the Work list `send_work`, where the backend's Work holds its tensor, as gloo's does)
                     p2p_held=0 if name == "gpipe" else
                     output_bytes * ((not first) + (not last)))
        out["schedules"][name] = dict(in_flight=in_flight, predicted=sum(terms.values()), terms=terms, peak=peak,
                                      step_ms=ms, workspace=meter.workspace)
        del runner, stage
        gc.collect()
    out.update(_one_micro_batch(module, first, last, x, target, micro_batch, device, comm))
    return out


# ------------------------------------------------------------------------------------------------ the launcher

def _facts(smoke: bool, worlds: list[int]) -> dict:
    import triton
    facts = dict(torch=torch.__version__, triton=triton.__version__)
    if smoke:
        return dict(facts, device=f"CPU (gloo smoke, {SMOKE_CONFIG['name']} config)")
    facts["device"] = f"{torch.cuda.get_device_name(0)} x {max(worlds)}"
    facts["cuda"] = torch.version.cuda
    facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return facts


def run(worlds=None, parts=None, smoke: bool = False) -> dict:
    """Every part on every world size (2, and 4 where there are 4 GPUs); smoke: gloo ranks and a tiny config."""
    from memfit.dist import run_ranks
    if smoke:
        cfg, sizes, backend = SMOKE_CONFIG, SMOKE, "gloo"
        worlds = list(worlds or (2,))
    else:
        gpus = torch.cuda.device_count()
        if gpus < 2:
            return {"skipped": f"needs 2 GPUs, this machine has {gpus}"}
        cfg, backend = MODEL, "nccl"
        sizes = dict(seq=SEQ, batch=BATCH, pp_seq=SEQ, warmup=WARMUP, steps=STEPS)
        worlds = [w for w in (worlds or (2, 4)) if w <= gpus]
        if not worlds:
            return {"skipped": f"no world size asked for fits the {gpus} GPUs of this machine"}
    parts = list(parts or PARTS)
    common = dict(cfg=cfg, dtype=DTYPE, warmup=sizes["warmup"], steps=sizes["steps"])
    args = {"tp": dict(seq=sizes["seq"], batch=sizes["batch"]), "torch_tp": dict(seq=sizes["seq"], batch=sizes["batch"]),
            "cp": dict(seq=sizes["seq"], batch=sizes["batch"]),
            "pp": dict(seq=sizes["pp_seq"], micro_batch=PP_MICRO_BATCH, n_micro=N_MICRO)}
    result = dict(model=cfg if isinstance(cfg, str) else cfg["name"], config=repr(_config(cfg)), dtype=DTYPE,
                  backend=backend, seq=sizes["seq"], batch=sizes["batch"], pp_seq=sizes["pp_seq"],
                  pp_micro_batch=PP_MICRO_BATCH, n_micro=N_MICRO, warmup=sizes["warmup"], steps=sizes["steps"],
                  worlds=worlds, **_facts(smoke, worlds), tp=[], cp=[], pp=[], errors=[])
    for world in worlds:
        for part in parts:
            start = time.perf_counter()
            try:
                ranks = run_ranks(f"benchmarks.parallelism:{part}_rank", world, backend=backend, timeout_s=TIMEOUT_S,
                                  args=dict(common, **args[part]))
            except Exception as exc:  # one part failing must not lose the others
                message = f"{type(exc).__name__}: {exc}"
                if len(message) > 6000:  # its first line says what failed; its end, the rank's traceback
                    message = f"{message[:1500]}\n...\n{message[-4000:]}"
                result["errors"].append(dict(world=world, part=part, error=message))
                print(f"parallelism: {part} on {world} ranks failed: {exc}", file=sys.stderr)
                continue
            print(f"parallelism: {part} on {world} ranks, {time.perf_counter() - start:.0f} s", file=sys.stderr)
            _collect(result, part, world, ranks)
    return result


def _collect(result: dict, part: str, world: int, ranks: list) -> None:
    def per_rank(rows, key):
        return [r[key] for r in rows]
    if part in ("tp", "torch_tp"):
        for variant in ("TP + SP", "TP"):
            r = [rank[variant] for rank in ranks]
            predicted = r[0]["predicted"]
            result["tp"].append(dict(
                world=world, engine="ours (tp_block)" if part == "tp" else "PyTorch (parallelize_module)",
                variant=variant, predicted=predicted, kept=per_rank(r, "kept"),
                ratio=[x["kept"] / predicted for x in r], saved=per_rank(r, "saved"),
                saved_ratio=[x["saved"] / predicted for x in r], peak=per_rank(r, "peak"),
                weight_grads=r[0]["weight_grads"], after_backward=per_rank(r, "after_backward"),
                step_ms=max(per_rank(r, "step_ms")), sent_per_step=r[0].get("sent_per_step"),
                max_rel_diff=max(per_rank(r, "max_rel_diff")), workspace=r[0]["workspace"],
                saved_unreadable=max(per_rank(r, "saved_unreadable"))))
    elif part == "cp":
        predicted = ranks[0]["predicted"]
        result["cp"].append(dict(
            world=world, tokens=ranks[0]["tokens"], predicted=predicted, kept=per_rank(ranks, "kept_released"),
            ratio=[x["kept_released"] / predicted for x in ranks], saved=per_rank(ranks, "saved"),
            held=[x["kept"] - x["kept_released"] for x in ranks], message=ranks[0]["message"],
            saved_ratio=[x["saved"] / predicted for x in ranks], peak=per_rank(ranks, "peak"),
            weight_grads=ranks[0]["weight_grads"], after_backward=per_rank(ranks, "after_backward"),
            step_ms=max(per_rank(ranks, "step_ms")), sent_per_step=ranks[0]["sent_per_step"],
            max_rel_diff=max(per_rank(ranks, "max_rel_diff")), workspace=ranks[0]["workspace"],
            saved_unreadable=max(per_rank(ranks, "saved_unreadable"))))
    else:
        for name in ("gpipe", "1f1b"):
            ms = max(r["schedules"][name]["step_ms"] for r in ranks)
            for r in ranks:
                s = r["schedules"][name]
                result["pp"].append(dict(
                    world=world, schedule=name, stage=r["stage"], layers=r["layers"], in_flight=s["in_flight"],
                    per_micro_batch_predicted=r["per_micro_batch_predicted"], per_micro_batch=r["kept"],
                    loss_predicted=r["loss_predicted"], loss_kept=r["loss_kept"], weight_grads=r["weight_grads"],
                    terms=s["terms"], predicted=s["predicted"], transient=r["transient"],
                    peak=s["peak"], ratio=s["peak"] / s["predicted"],
                    ratio_with_transient=s["peak"] / (s["predicted"] + r["transient"]),
                    unexplained=s["peak"] - s["predicted"] - r["transient"], step_ms=ms, workspace=s["workspace"]))


def _spread(values, fmt) -> str:
    """One figure where every rank has it, else each rank's distinct ones."""
    shown = list(dict.fromkeys(fmt(v) for v in values))
    return " / ".join(shown)


def markdown(result: dict) -> str:
    title = "### Lesson 09: tensor, sequence, context and pipeline parallelism"
    if "skipped" in result:
        return f"{title}\n\nskipped: {result['skipped']}"
    unit, scale = ("KiB", 2**10) if result["backend"] == "gloo" else ("MiB", 2**20)
    b = lambda n: f"{n / scale:,.1f}"  # noqa: E731
    ratio = lambda v: f"{v:.4f}"  # noqa: E731
    lines = [f"{title} on {' and '.join(map(str, result['worlds']))} ranks ({result['backend']})", "",
             f"Device: {result['device']}; torch {result['torch']}, triton {result['triton']}"
             + (f", CUDA {result['cuda']}, NCCL {result['nccl']}" if "nccl" in result else "") + ".", "",
             f"{result['config']} in {result['dtype']}. {unit} per rank (each rank's figure where they differ). "
             "Kept = alive after forward - output + input (memfit.meter, after warm-up steps); saved = the same "
             "counted from the storages autograd saves (+ the input); peak = forward + backward from no gradients; "
             f"times: median of {result['steps']} steps after {result['warmup']} warm-up, the slowest rank's; max "
             "rel. diff. = the largest difference from the unsharded blocks over their largest value.", ""]
    if result["tp"]:
        lines += [f"#### Tensor parallelism: {result['seq']} tokens x {result['batch']}, a stack of the config's blocks",
                  "", "Predicted: n_layers x tp_activation_bytes(cfg, seq, batch, tp, sp, \"none\", 2), the same for "
                  "both engines.", "",
                  "| GPUs | engine | variant | kept: predicted | measured | ratio | saved (ratio) | peak | "
                  "weight grads | step ms | sent/step | max rel. diff. |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in sorted(result["tp"], key=lambda r: (r["world"], r["variant"] != "TP + SP", r["engine"])):
            sent = b(r["sent_per_step"]) if r["sent_per_step"] is not None else "n/a"
            lines.append(f"| {r['world']} | {r['engine']} | {r['variant']} | {b(r['predicted'])} | "
                         f"{_spread(r['kept'], b)} | {_spread(r['ratio'], ratio)} | {_spread(r['saved'], b)} "
                         f"({_spread(r['saved_ratio'], ratio)}) | {_spread(r['peak'], b)} | {b(r['weight_grads'])} | "
                         f"{r['step_ms']:.1f} | {sent} | {r['max_rel_diff']:.1e} |")
        if result["backend"] == "gloo" and any(r["engine"].startswith("PyTorch") for r in result["tp"]):
            lines += ["", "On a CPU, PyTorch's measured and peak figures are not meaningful: the live-tensor meter (a "
                      "TorchDispatchMode) sees a DTensor op from above the subclass, counts a DTensor at its global "
                      "size and never sees the local ops inside it. Its saved column counts the local shards; on a "
                      "GPU the CUDA allocator's meter counts everything."]
        lines.append("")
    if result["cp"]:
        lines += [f"#### Context parallelism: ring attention, {result['seq']} tokens x {result['batch']} cut over the "
                  "ranks (cp_positions)", "",
                  "Predicted: n_layers x tp_activation_bytes(cfg, seq // cp, batch, 1, False, \"none\", 2): "
                  "ring_attention saves q, k, v, its output and an fp32 log-sum-exp, what SDPA saves. Measured "
                  "after one more P2P call (a 4-byte ring_pass): NCCL can keep referencing the last ring_pass's "
                  "send and receive buffers until the rank's next P2P call (not its next collective, nor after "
                  "seconds); \"held\" is that, read before the call, in ring messages (K and V stacked).", "",
                  "| GPUs (cp) | tokens per rank | kept: predicted | measured | ratio | held by the backend (messages) | "
                  "saved (ratio) | peak | weight grads | step ms | sent/step | max rel. diff. |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in result["cp"]:
            message = r["message"]
            in_messages = lambda n: f"{b(n)} ({n / message:.2f})"  # noqa: E731
            lines.append(f"| {r['world']} | {r['tokens']} | {b(r['predicted'])} | {_spread(r['kept'], b)} | "
                         f"{_spread(r['ratio'], ratio)} | "
                         f"{_spread(r['held'], in_messages)} | "
                         f"{_spread(r['saved'], b)} ({_spread(r['saved_ratio'], ratio)})"
                         f" | {_spread(r['peak'], b)} | {b(r['weight_grads'])} | {r['step_ms']:.1f} | "
                         f"{b(r['sent_per_step'])} | {r['max_rel_diff']:.1e} |")
        lines.append("")
    if result["pp"]:
        lines += [f"#### Pipeline parallelism: torch.distributed.pipelining, {result['n_micro']} micro-batches of "
                  f"{result['pp_micro_batch']} x {result['pp_seq']} tokens, one stage per GPU", "",
                  "Predicted peak = in flight (pipeline_schedule) x one micro-batch (layers x tp_activation_bytes, + "
                  "the last stage's fp32 loss input) + weight gradients + other named terms (the last stage's losses "
                  "and the outputs it returns where the schedule cannot be told not to; stage 0's first 1/rms, not "
                  "saved for an input that needs no gradient; 1F1B's last P2P tensors, referenced past their use: "
                  "see the JSON's terms). Backward's transient for one micro-batch is measured alone on the stage; "
                  "unexplained = measured - predicted - transient.", "",
                  "| GPUs | schedule | stage | layers | in flight | micro-batch: predicted | measured | weight grads "
                  "| other named | predicted peak | bwd transient | measured peak | ratio | with transient | unexplained | step ms |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in result["pp"]:
            per = r["per_micro_batch_predicted"] + r["loss_predicted"]
            got = r["per_micro_batch"] + r["loss_kept"]
            other = r["predicted"] - r["terms"]["activations"] - r["terms"]["loss"] - r["weight_grads"]
            lines.append(f"| {r['world']} | {r['schedule']} | {r['stage']} | {r['layers']} | {r['in_flight']} | "
                         f"{b(per)} | {b(got)} | {b(r['weight_grads'])} | {b(other)} | {b(r['predicted'])} | "
                         f"{b(r['transient'])} | "
                         f"{b(r['peak'])} | {r['ratio']:.3f} | {r['ratio_with_transient']:.4f} | "
                         f"{b(r['unexplained'])} | {r['step_ms']:.1f} |")
        lines.append("")
    workspace = next((r["workspace"] for r in result["tp"] + result["cp"] + result["pp"] if r.get("workspace")), 0)
    if workspace:
        lines += [f"cuBLAS workspace per rank, created before each measurement and not in the figures: "
                  f"{b(workspace)} {unit}.", ""]
    unreadable = sum(r["saved_unreadable"] for r in result["tp"] + result["cp"])
    if unreadable:
        lines += [f"{unreadable} saved tensors had no readable storage (wrapper subclasses): counted by their "
                  "elements in the saved figures.", ""]
    for err in result["errors"]:
        said = [line.strip() for line in err["error"].splitlines() if line.strip()]
        lines += [f"**{err['part']} on {err['world']} ranks failed**: `{said[0][:300]}` ... `{said[-1][:300]}`", ""]
    return "\n".join(lines).rstrip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="gloo ranks on this CPU, a tiny config")
    parser.add_argument("--worlds", type=int, nargs="+", help="world sizes (default: 2 and 4 where possible; smoke: 2)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, help=f"parts to run (default: all of {PARTS})")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        result = run(args.worlds, args.parts, smoke=True)
        print(markdown(result))
        return 1 if result["errors"] else 0
    if not torch.cuda.is_available():
        print("benchmarks.parallelism needs 2 or more CUDA GPUs (one NCCL process each); this machine has none. "
              "`python -m benchmarks.parallelism --cpu-smoke` runs its logic on gloo with a tiny config. "
              "Recorded results are in benchmarks/results/.")
        return 0
    if torch.cuda.device_count() < 2:
        print(markdown(run()))
        return 0
    from benchmarks.record import record_one
    partial = bool(args.worlds or args.parts)
    suffix = "-".join([*(args.parts or []), *(f"x{w}" for w in args.worlds or [])])
    record_one("parallelism", multi_gpu=True, run=(lambda: run(args.worlds, args.parts)) if partial else None,
               part=suffix if partial else "")
    return 0


if __name__ == "__main__":  # this lesson alone, on 2+ GPUs: python -m benchmarks.parallelism
    sys.exit(main())
