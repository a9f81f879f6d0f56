"""What lesson 09's tensor, sequence, context and pipeline parallelism run on: the pieces that are not exercises.

    block_params(cfg, seed)       one block of the course GPT as named tensors (wqkv, wo, w13, w2, norm1, norm2)
    full_block(x, params, cfg)    the unsharded block in Megatron's (seq, batch, d_model) layout: the reference
    rope_sbh(cfg, seq, dtype)     RoPE's tables for that layout, made once per step and handed to every block
    cp_positions(seq, cp, rank)   the load-balanced ("zigzag") positions rank holds under context parallelism
    attention_with_lse(...)       one block pair of causal or full attention, returning the log-sum-exp too, and its
    attention_with_lse_backward   backward: the per-block math of lesson 05 in PyTorch, tiled over queries so that
                                  memory grows with the sequence, not its square
    comm_bytes_per_gpu(...)       what one GPU sends in a training step of a (dp, tp, pp, cp) layout (the planner's cost)

Ranks talk through memfit.zero's Comm (simulated threads, or torch.distributed), which counts the bytes each sends.
"""
from __future__ import annotations

import functools

import torch

from memfit.gpt import GPTConfig, apply_rope, n_params_of_config, rope_tables, rms_norm, swiglu

BLOCK_PARAMS = ("norm1", "wqkv", "wo", "norm2", "w13", "w2")


def block_params(cfg: GPTConfig, seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu") -> dict:
    """One block's parameters, named as the course GPT names them (wqkv is q, k, v stacked by rows; w13 is gate and
    up): random with std 0.02 (norm weights near 1), the same for the same seed on every rank."""
    g = torch.Generator().manual_seed(seed)
    h, f = cfg.d_model, cfg.ffn_hidden

    def normal(*shape, std=0.02, mean=0.0):
        return (torch.randn(*shape, generator=g) * std + mean).to(device=device, dtype=dtype)
    return {"norm1": normal(h, std=0.1, mean=1.0), "wqkv": normal(cfg.q_dim + 2 * cfg.kv_dim, h),
            "wo": normal(h, cfg.q_dim), "norm2": normal(h, std=0.1, mean=1.0), "w13": normal(2 * f, h),
            "w2": normal(h, f)}


def rope_sbh(cfg: GPTConfig, seq: int, dtype: torch.dtype = torch.float32, device="cpu",
             positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (seq, 1, 1, head_dim) in `dtype`: RoPE for (seq, batch, heads, head_dim) tensors. With
    `positions`, the rows of those positions only (a context-parallel rank's tokens)."""
    n = seq if positions is None else int(positions.max()) + 1
    cos, sin = rope_tables(cfg, n, device)
    if positions is not None:
        cos, sin = cos[positions.to(cos.device)], sin[positions.to(sin.device)]
    return cos[:, None].to(dtype), sin[:, None].to(dtype)


def full_block(x: torch.Tensor, params: dict, cfg: GPTConfig, rope) -> torch.Tensor:
    """The course GPT's block, unsharded, on x of shape (seq, batch, d_model): what every TP rank must reproduce."""
    s, b, h = x.shape
    cos, sin = rope
    q, k, v = (rms_norm(x, params["norm1"], cfg.norm_eps) @ params["wqkv"].T).split(
        [cfg.q_dim, cfg.kv_dim, cfg.kv_dim], dim=-1)
    q = apply_rope(q.reshape(s, b, cfg.n_heads, cfg.head_dim), cos, sin)
    k = apply_rope(k.reshape(s, b, cfg.n_kv_heads, cfg.head_dim), cos, sin)
    v = v.reshape(s, b, cfg.n_kv_heads, cfg.head_dim)
    group = cfg.n_heads // cfg.n_kv_heads
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    y = torch.nn.functional.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)), is_causal=True)
    x = x + y.permute(2, 0, 1, 3).reshape(s, b, cfg.q_dim) @ params["wo"].T
    gate, up = (rms_norm(x, params["norm2"], cfg.norm_eps) @ params["w13"].T).chunk(2, dim=-1)
    return x + swiglu(gate, up) @ params["w2"].T


# ------------------------------------------------------------------------------------ context parallelism

def cp_positions(seq: int, cp: int, rank: int) -> torch.Tensor:
    """The positions rank holds when a causal sequence of `seq` tokens is split over `cp` ranks, load-balanced:
    cut into 2·cp equal chunks, rank r holds chunks r and 2·cp - 1 - r (an early chunk with little to attend to and a
    late one with much), so every rank does the same work."""
    if cp < 1 or seq % (2 * cp):
        raise ValueError(f"seq={seq} must be a multiple of 2 * cp = {2 * cp}")
    if not 0 <= rank < cp:
        raise ValueError(f"rank must be in 0..{cp - 1}, got {rank}")
    c = seq // (2 * cp)
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)])


QUERY_TILE = 64  # queries per tile in attention_with_lse: the scores of one tile are (QUERY_TILE, keys)


def _wide(t: torch.Tensor) -> torch.Tensor:
    """t in the precision the block's arithmetic runs in: fp32, or fp64 for fp64 inputs."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _scores(q, k, rows: slice, causal: bool, scale: float) -> torch.Tensor:
    s = (_wide(q[..., rows, :]) @ _wide(k).transpose(-2, -1)) * scale
    if causal:
        i = torch.arange(rows.start, rows.stop, device=q.device)[:, None]
        s = s.masked_fill(torch.arange(k.shape[-2], device=q.device)[None, :] > i, float("-inf"))
    return s


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ / sqrt(d)) v for (..., n_q, d) queries and (..., n_k, d) keys and values, and the log-sum-exp of
    each query's scores (..., n_q), both in fp32 (fp64 for fp64 inputs): a block's share, to be merged with others
    before anything is rounded to the inputs' dtype. causal: query i sees keys 0..i (n_q == n_k, one chunk of the
    sequence against itself). Tiled over queries: memory grows with n_q + n_k, not n_q·n_k."""
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError("causal attention_with_lse pairs a chunk with itself: n_q must equal n_k")
    scale = q.shape[-1] ** -0.5
    wide = torch.promote_types(q.dtype, torch.float32)
    out = torch.empty(q.shape, dtype=wide, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=wide, device=q.device)
    for start in range(0, q.shape[-2], QUERY_TILE):
        rows = slice(start, min(start + QUERY_TILE, q.shape[-2]))
        s = _scores(q, k, rows, causal, scale)
        lse[..., rows] = torch.logsumexp(s, dim=-1)
        out[..., rows, :] = torch.exp(s - lse[..., rows, None]) @ _wide(v)
    return out, lse


def attention_with_lse_backward(q, k, v, out, dout, lse, causal: bool):
    """Gradients (dq, dk, dv) of attention_with_lse's block, given the final output `out`, its gradient `dout` and
    the final log-sum-exp `lse` of each query (over every key it sees, in every block): P = exp(S - lse) is then this
    block's share of the softmax, and dS = P·(dP - rowsum(dout·out)) as in FlashAttention's backward. The gradients
    come back in fp32 (fp64 for fp64 inputs), to be summed over blocks before they are rounded."""
    scale = q.shape[-1] ** -0.5
    dq, dk, dv = (torch.zeros(t.shape, dtype=torch.promote_types(t.dtype, torch.float32), device=t.device)
                  for t in (q, k, v))
    delta = (_wide(dout) * _wide(out)).sum(-1)
    for start in range(0, q.shape[-2], QUERY_TILE):
        rows = slice(start, min(start + QUERY_TILE, q.shape[-2]))
        p = torch.exp(_scores(q, k, rows, causal, scale) - lse[..., rows, None])
        do = _wide(dout[..., rows, :])
        dv += p.transpose(-2, -1) @ do
        ds = p * (do @ _wide(v).transpose(-2, -1) - delta[..., rows, None])
        dq[..., rows, :] = ds @ _wide(k) * scale
        dk += ds.transpose(-2, -1) @ _wide(q[..., rows, :]) * scale
    return dq, dk, dv


# ------------------------------------------------------------------------------------------- the planner's costs

def stage_params(cfg: GPTConfig, tp: int, pp: int) -> int:
    """Parameters one GPU holds of the largest pipeline stage, before ZeRO shards them: ceil(n_layers / pp) blocks with
    their matmul weights split tp ways (the two norms whole), the vocabulary split tp ways (Megatron's vocab-parallel
    embedding and head, the vocabulary padded to a multiple of tp): the embedding and the head both when pp = 1 (one,
    tied, when the config ties them), one of them on the first or last stage otherwise, and the final norm."""
    if tp < 1 or pp < 1 or pp > cfg.n_layers:
        raise ValueError(f"tp={tp} and pp={pp} must be at least 1, and pp at most n_layers={cfg.n_layers}")
    h = cfg.d_model
    block = (h * (cfg.q_dim + 2 * cfg.kv_dim) + cfg.q_dim * h + 3 * h * cfg.ffn_hidden) // tp + 2 * h
    vocab = -(-cfg.vocab_size // tp) * h
    return -(-cfg.n_layers // pp) * block + vocab * (2 if pp == 1 and not cfg.tie_embeddings else 1) + h


def comm_bytes_per_gpu(cfg: GPTConfig, seq_len: int, micro_batch: int, n_micro: int, tp: int, pp: int, cp: int,
                       dp: int, zero: int, recompute: str) -> dict[str, int]:
    """Bytes one GPU sends in one training step (bf16 activations and gradients, ring collectives counted as
    memfit.zero's Comm counts them), by kind: "tp" (sequence parallel: 4 all-gathers or reduce-scatters of the
    residual stream per block forward, 4 in backward, 4 more when backward recomputes the forward), "cp" (ring
    attention: the rank's K and V passed cp - 1 times forward and again in backward, their fp32 gradients passed cp
    times), "pp" (a stage's output sent on, its gradient sent back, per micro-batch), "dp" (the gradients reduced
    over the dp·cp ranks that hold the same weights: an all-reduce, or ZeRO's reduce-scatter and all-gather, stage 3
    gathering the parameters twice), and "total"."""
    layers = -(-cfg.n_layers // pp)
    tokens = seq_len // cp * micro_batch  # a rank's tokens per micro-batch
    stream = tokens // tp * cfg.d_model * 2  # bytes of the rank's residual-stream shard
    forwards = 3 if recompute == "full" else 2  # forward, backward, and the forward again
    out = {"tp": forwards * 4 * (tp - 1) * stream * layers * n_micro}
    kv = 2 * tokens * (cfg.kv_dim // tp) * 2  # K and V of the rank's kv heads, bf16
    per_layer = (forwards - 1) * (cp - 1) * kv + (cp - 1) * kv + cp * 2 * kv if cp > 1 else 0
    out["cp"] = per_layer * layers * n_micro
    out["pp"] = 2 * stream * n_micro if pp > 1 else 0
    d = dp * cp
    psi = stage_params(cfg, tp, pp)
    shard = -(-psi // d)
    out["dp"] = 0 if d == 1 else (2 * (d - 1) * 2 * psi // d if zero == 0 else (3 if zero == 3 else 2) * (d - 1) * shard * 2)
    out["total"] = sum(out.values())
    return out


NVLINK_BYTES_PER_S = 450e9  # one H100's NVLink, each direction (NVIDIA: 900 GB/s both ways)
NETWORK_BYTES_PER_S = 50e9  # one GPU's 400 Gb/s InfiniBand or RoCE port, between nodes
ACHIEVED_FLOPS = 400e12  # bf16 on an H100 at about 40% of its dense peak, as Llama 3's paper reports (38-43% MFU)


@functools.lru_cache(maxsize=64)
def _n_params(cfg: GPTConfig) -> int:
    return n_params_of_config(cfg)


def model_flops_per_token(cfg: GPTConfig, seq_len: int) -> float:
    """Training FLOPs per token, forward and backward: 6 per parameter, and causal attention's 6·seq·q_dim per
    layer (its two matmuls, 2·2·q_dim per key seen, seq/2 keys on average, backward twice the forward)."""
    return 6 * _n_params(cfg) + 6 * seq_len * cfg.q_dim * cfg.n_layers


def layout_cost(cfg: GPTConfig, seq_len: int, micro_batch: int, n_micro: int, tp: int, pp: int, cp: int, dp: int,
                zero: int, recompute: str, gpus_per_node: int = 8) -> dict[str, float]:
    """Seconds a step of this layout loses, per GPU, beside the model's own FLOPs: the planner's objective.

    Ranks are laid out tp innermost, then cp, pp and dp (Llama 3's order), so a group is inside one node when the
    product of its size and the sizes inside it is at most gpus_per_node; its bytes (comm_bytes_per_gpu) then move at
    NVLink's speed, else at the network's. Communication is counted as not overlapped with compute. The pipeline's
    bubble is (pp - 1) / n_micro of the compute (1F1B), and full recomputation adds a forward: 2 of the 6 FLOPs."""
    sent = comm_bytes_per_gpu(cfg, seq_len, micro_batch, n_micro, tp, pp, cp, dp, zero, recompute)
    inside = {"tp": tp, "cp": tp * cp, "pp": tp * cp * pp, "dp": tp * cp * pp * dp}
    comm_s = sum(sent[k] / (NVLINK_BYTES_PER_S if inside[k] <= gpus_per_node else NETWORK_BYTES_PER_S) for k in inside)
    tokens = seq_len * micro_batch * n_micro * dp / (tp * pp * cp * dp)  # the step's tokens, per GPU
    compute_s = model_flops_per_token(cfg, seq_len) * tokens / ACHIEVED_FLOPS
    recompute_s = compute_s / 3 if recompute == "full" else 0.0
    bubble_s = (pp - 1) / n_micro * (compute_s + recompute_s)
    return {"comm_bytes": sent["total"], "comm_s": comm_s, "bubble_s": bubble_s, "recompute_s": recompute_s,
            "compute_s": compute_s, "overhead_s": comm_s + bubble_s + recompute_s}


# ------------------------------------------------------------------------------ running the lesson's code on ranks

def _tp_inputs(cfg: GPTConfig, tp: int, seq: int, batch: int, sequence_parallel: bool, rank: int, dtype, device="cpu"):
    """The block's weights, the input x and the output's gradient dy (the same on every rank, from fixed seeds), and
    this rank's part of x and dy."""
    params = block_params(cfg, seed=1, dtype=dtype, device=device)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(seq, batch, cfg.d_model, generator=g).to(device=device, dtype=dtype)
    dy = torch.randn(seq, batch, cfg.d_model, generator=g).to(device=device, dtype=dtype)
    rows = slice(rank * seq // tp, (rank + 1) * seq // tp) if sequence_parallel else slice(None)
    return params, x, dy, rows


def kept_by_tp_block(tp_block, shard_block, cfg: GPTConfig, tp: int, seq: int, batch: int, sequence_parallel: bool,
                     dtype: torch.dtype = torch.float32) -> int:
    """Bytes rank 0 keeps from forward to backward in one tp_block on `tp` simulated ranks, the block's input included:
    what the live-tensor meter finds alive after forward, less the output."""
    from memfit.meter import open_meter
    from memfit.zero import simulate

    def rank(comm):
        params, x, _, rows = _tp_inputs(cfg, tp, seq, batch, sequence_parallel, comm.rank, dtype)
        shard = {k: v.requires_grad_() for k, v in shard_block(params, cfg, tp, comm.rank).items()}
        x = x[rows].clone().requires_grad_()
        rope = rope_sbh(cfg, seq, dtype)
        with open_meter("cpu") as meter:
            out = tp_block(x, shard, cfg, comm, rope, sequence_parallel)
            kept = meter.current - out.untyped_storage().nbytes() + x.untyped_storage().nbytes()
        out.backward(torch.ones_like(out))  # every rank takes part in backward's collectives
        return kept
    return simulate(tp, rank)[0]


def _tp_rank(rank: int, world_size: int, tp_block, shard_block, cfg: GPTConfig, seq: int, batch: int,
             sequence_parallel: bool) -> dict:
    import torch.distributed as dist
    from memfit.zero import TorchComm
    comm = TorchComm()
    params, x, dy, rows = _tp_inputs(cfg, world_size, seq, batch, sequence_parallel, rank, torch.float32)
    rope = rope_sbh(cfg, seq)
    shard = {k: v.requires_grad_() for k, v in shard_block(params, cfg, world_size, rank).items()}
    mine = x[rows].clone().requires_grad_()
    out = tp_block(mine, shard, cfg, comm, rope, sequence_parallel)
    out.backward(dy[rows])
    sent = comm.sent_bytes
    if sequence_parallel:  # every rank's rows, in rank order
        parts = [torch.empty_like(out) for _ in range(world_size)], [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(parts[0], out.detach().contiguous())
        dist.all_gather(parts[1], mine.grad.contiguous())
        out, grad = torch.cat(parts[0]), torch.cat(parts[1])
    else:
        grad = mine.grad
    whole = x.clone().requires_grad_()
    want = full_block(whole, {k: v.clone().requires_grad_() for k, v in params.items()}, cfg, rope)
    want.backward(dy)
    return {"output_error": float((out - want).abs().max()), "grad_error": float((grad - whole.grad).abs().max()),
            "sent_bytes": sent}


def tp_on_ranks(tp_block, shard_block, cfg: GPTConfig, tp: int, seq: int, batch: int,
                sequence_parallel: bool = False) -> list[dict]:
    """tp_block forward and backward on `tp` gloo processes against the unsharded block: per rank, the largest
    difference of the output and of x's gradient, and the bytes it sent."""
    from memfit.dist import run_ranks
    return run_ranks(_tp_rank, tp, args=dict(tp_block=tp_block, shard_block=shard_block, cfg=cfg, seq=seq,
                                             batch=batch, sequence_parallel=sequence_parallel))


def ring_peaks(ring_attention, cp: int, seq: int, batch: int, heads: int, head_dim: int,
               dtype: torch.dtype = torch.float32) -> list[int]:
    """Each of `cp` simulated ranks' peak bytes over ring_attention's forward and backward on its tokens of a random
    causal problem (its q, k, v and the output's gradient made before the meter starts)."""
    from memfit.meter import open_meter
    from memfit.zero import simulate

    def rank(comm):
        g = torch.Generator().manual_seed(comm.rank)
        q, k, v, dout = (torch.randn(seq // cp, batch, heads, head_dim, generator=g, dtype=dtype) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_()
        with open_meter("cpu") as meter:
            ring_attention(q, k, v, comm).backward(dout)
            return meter.peak
    return simulate(cp, rank)


class PipelineStageModule(torch.nn.Module):
    """A run of the course GPT's blocks, (batch, seq, d_model) in and out: one pipeline stage."""

    def __init__(self, cfg: GPTConfig, layers: range, seq: int, device="cpu"):
        super().__init__()
        from memfit.gpt import Block
        self.blocks = torch.nn.ModuleList()
        for layer in layers:  # each block from its own seed: the same weights whichever stage builds it
            torch.manual_seed(1000 + layer)
            self.blocks.append(Block(cfg).to(device))
        cos, sin = rope_tables(cfg, seq, device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return x


def stage_layers(n_layers: int, n_stages: int, stage: int) -> range:
    """The layers of `stage`: ceil(n_layers / n_stages) each, the last stage the rest."""
    per = -(-n_layers // n_stages)
    return range(stage * per, min(n_layers, (stage + 1) * per))


def _pipeline_rank(rank: int, world_size: int, schedule: str, cfg: GPTConfig, n_micro: int, seq: int, batch: int,
                   device: str = "cpu") -> dict:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from memfit.meter import open_meter
    module = PipelineStageModule(cfg, stage_layers(cfg.n_layers, world_size, rank), seq, device)
    stage = PipelineStage(module, rank, world_size, torch.device(device))
    runner = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule](
        stage, n_microbatches=n_micro, loss_fn=lambda y, target: (y.float() - target).pow(2).mean())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, seq, cfg.d_model, generator=g).to(device)
    target = torch.randn(batch, seq, cfg.d_model, generator=g).to(device)

    def step():
        if rank == 0:
            runner.step(x)
        elif rank == world_size - 1:
            runner.step(target=target, losses=[])
        else:
            runner.step()
    step()  # a first step: the stage's buffers and the gradients' storage exist from now on
    with open_meter(device) as meter:
        step()
        peak = meter.peak
    micro = x[: batch // n_micro].clone().requires_grad_()
    with open_meter(device) as meter:  # what one micro-batch's forward keeps on this stage, its input included
        out = module(micro)
        per_micro_batch = meter.current - out.untyped_storage().nbytes() + micro.untyped_storage().nbytes()
    return {"peak": peak, "per_micro_batch": per_micro_batch}


def pipeline_on_ranks(schedule: str, cfg: GPTConfig, n_stages: int, n_micro: int, seq: int, batch: int) -> list[dict]:
    """One training step of the course GPT's blocks cut into n_stages stages on gloo processes, under
    torch.distributed.pipelining's GPipe or 1F1B: per stage, the peak bytes of a step (after a first one) and what
    one micro-batch's forward keeps there."""
    from memfit.dist import run_ranks
    return run_ranks(_pipeline_rank, n_stages, args=dict(schedule=schedule, cfg=cfg, n_micro=n_micro, seq=seq,
                                                          batch=batch))
