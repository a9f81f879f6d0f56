"""The course GPT: a Llama-style decoder in plain PyTorch, small enough to hold in your head.

Token embedding -> n_layers x [RMSNorm -> attention (grouped-query, RoPE, causal) -> residual,
RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> output head -> cross-entropy.

Written for memory lessons: every op is a plain PyTorch op, so the tensors autograd saves are the
ones you can read off the code (lesson 02 counts them). Two choices follow real trainers:
the q/k/v projections are one matmul (`wqkv`) and the SwiGLU gate and up projections are one
(`w13`), so each normalized input is cast and saved once. Grouped-query heads are expanded with
`repeat_interleave` before attention, as many codebases do.

Attention and the loss are plain PyTorch unless the model is given others: `attention(q, k, v)`, causal over
(batch, heads, seq, head_dim) tensors, and `loss(x, weight, targets)`, the mean cross-entropy of the head's logits
x·weightᵀ for x (tokens, d_model), computed without holding them if it can (lesson 08 passes lesson 05's
FlashAttention and lesson 06's fused linear cross-entropy; the library never imports a lesson's code).

`recompute` ("none", "selective", "full") decides what backward recomputes instead of storing:
"full" checkpoints every block (only its input is kept); "selective" keeps the outputs of the
matmuls and of attention and recomputes the cheap elementwise ops between them (norms, RoPE,
SiLU and the gating product), the policy torchtitan calls op-level selective checkpointing.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    tie_embeddings: bool = False
    max_seq_len: int = 2048
    norm_eps: float = 1e-5
    rope_theta: float = 500_000.0
    name: str = field(default="", compare=False)

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not a multiple of n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def scaled(self, **changes) -> "GPTConfig":
        return replace(self, **changes)


# Published configurations (Hugging Face config.json of each model).
LLAMA_3_1_8B = GPTConfig(vocab_size=128_256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                         ffn_hidden=14_336, max_seq_len=131_072, name="Llama-3.1-8B")
LLAMA_3_1_70B = GPTConfig(vocab_size=128_256, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8,
                          ffn_hidden=28_672, max_seq_len=131_072, name="Llama-3.1-70B")
LLAMA_3_1_405B = GPTConfig(vocab_size=128_256, d_model=16_384, n_layers=126, n_heads=128, n_kv_heads=8,
                           ffn_hidden=53_248, max_seq_len=131_072, name="Llama-3.1-405B")
LLAMA_3_2_1B = GPTConfig(vocab_size=128_256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                         ffn_hidden=8192, tie_embeddings=True, max_seq_len=131_072, name="Llama-3.2-1B")

# Course models: measured in the lessons. "tiny" runs on a 2-core CPU in seconds; "small" and
# "medium" fit a 15 GB T4 at the sequence lengths the lessons use.
COURSE_CONFIGS = {
    "tiny": GPTConfig(vocab_size=2048, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=384,
                      max_seq_len=512, name="course-tiny"),
    "tiny-mha": GPTConfig(vocab_size=1024, d_model=96, n_layers=3, n_heads=3, n_kv_heads=3, ffn_hidden=256,
                          tie_embeddings=True, max_seq_len=512, name="course-tiny-mha"),
    "small": GPTConfig(vocab_size=32_000, d_model=512, n_layers=8, n_heads=8, n_kv_heads=8, ffn_hidden=1408,
                       max_seq_len=4096, name="course-small"),
    "medium": GPTConfig(vocab_size=32_000, d_model=1024, n_layers=12, n_heads=16, n_kv_heads=4, ffn_hidden=2816,
                        max_seq_len=4096, name="course-medium"),
}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, in eager PyTorch (the formula lesson 04 fuses)."""
    inv_rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * inv_rms * weight


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation, in eager PyTorch (the formula lesson 04 fuses)."""
    return F.silu(gate) * up


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rope_tables(cfg: GPTConfig, seq: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    half = cfg.head_dim // 2
    freqs = cfg.rope_theta ** (-torch.arange(half, dtype=torch.float64, device=device) / half)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64, device=device), freqs)
    angles = torch.cat([angles, angles], dim=-1)[:, None, :]  # (seq, 1, head_dim): broadcast over heads
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    """x: (batch, seq, heads, head_dim). Rotates pairs (i, i + head_dim/2) by position-dependent angles."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def causal_sdpa(q, k, v):
    """PyTorch's attention, causal: the course GPT's default."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig, attention=causal_sdpa):
        super().__init__()
        self.cfg, self.attention = cfg, attention
        kv = cfg.n_kv_heads * cfg.head_dim
        self.wqkv = nn.Linear(cfg.d_model, cfg.d_model + 2 * kv, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x, cos, sin):
        cfg, (b, s, _) = self.cfg, x.shape
        kv = cfg.n_kv_heads * cfg.head_dim
        q, k, v = self.wqkv(x).split([cfg.d_model, kv, kv], dim=-1)
        q = apply_rope(q.view(b, s, cfg.n_heads, cfg.head_dim), cos, sin)
        k = apply_rope(k.view(b, s, cfg.n_kv_heads, cfg.head_dim), cos, sin)
        v = v.view(b, s, cfg.n_kv_heads, cfg.head_dim)
        if cfg.n_kv_heads != cfg.n_heads:  # grouped-query: each K/V head serves n_heads / n_kv_heads queries
            k = k.repeat_interleave(cfg.n_heads // cfg.n_kv_heads, dim=2)
            v = v.repeat_interleave(cfg.n_heads // cfg.n_kv_heads, dim=2)
        y = self.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.wo(y.transpose(1, 2).reshape(b, s, cfg.d_model))


class SwiGLU(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.w13 = nn.Linear(cfg.d_model, 2 * cfg.ffn_hidden, bias=False)  # gate and up, one matmul
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x):
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(swiglu(gate, up))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, attention=causal_sdpa):
        super().__init__()
        self.norm1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, attention)
        self.norm2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


def _selective_policy():
    """Op-level selective recomputation: keep what is expensive to recompute (matmuls, attention),
    recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    aten = torch.ops.aten
    keep = {aten.mm.default, aten._scaled_dot_product_flash_attention.default,
            aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_cudnn_attention.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return lambda: create_selective_checkpoint_contexts(policy)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, recompute: str = "none", attention=None, loss=None):
        super().__init__()
        self.cfg = cfg
        self.recompute = recompute
        self.loss = loss  # None: the head's logits, then F.cross_entropy in fp32
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, attention or causal_sdpa) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        self.apply(self._init)

    @staticmethod
    def _init(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    @property
    def recompute(self) -> str:
        return self._recompute

    @recompute.setter
    def recompute(self, mode: str) -> None:
        if mode not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, not {mode!r}")
        self._recompute = mode

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        b, s = idx.shape
        if s > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {s} exceeds max_seq_len={self.cfg.max_seq_len}")
        cos, sin = rope_tables(self.cfg, s, idx.device)
        x = self.embed(idx)
        for block in self.blocks:
            if self.recompute == "none" or not torch.is_grad_enabled():
                x = block(x, cos, sin)
            elif self.recompute == "full":
                x = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = checkpoint(block, x, cos, sin, use_reentrant=False, context_fn=_selective_policy())
        x = self.norm(x)
        if targets is None:
            return self.head(x)
        if self.loss is not None:
            return self.loss(x.view(b * s, -1), self.head.weight, targets.view(b * s))
        # The loss in fp32, as trainers do under mixed precision. No name holds the head's output, so
        # the low-precision logits are freed as soon as their fp32 copy exists.
        return F.cross_entropy(self.head(x).float().view(b * s, -1), targets.view(b * s))


def unique_parameters(model: nn.Module) -> list[nn.Parameter]:
    """A model's parameters, a shared one (a tied head and embedding) listed once."""
    return list({id(p): p for p in model.parameters()}.values())


def n_params(model: nn.Module) -> int:
    """Parameters of a model, each shared tensor counted once."""
    return sum(p.numel() for p in unique_parameters(model))
