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

Three options let the same code build other published decoders (all off by default, so the course's own configs
build exactly the model above): `qkv_bias` (Qwen2's biases on the q, k and v projections), `head_dim_override`
(Gemma's 256-wide heads, which are not d_model / n_heads) and `post_norms` (Gemma-2's RMSNorm on each block's
attention and MLP outputs, before the residual add: four norms per layer). `GPTConfig.from_hf_config` reads a
Hugging Face config.json into a GPTConfig; memfit/hf_configs/ ships five published ones (`HF_CONFIG_DIR`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

RECOMPUTE_MODES = ("none", "selective", "full")
HF_CONFIG_DIR = Path(__file__).resolve().parent / "hf_configs"  # published config.json files, one per model


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
    # Options for other published decoders; their defaults build the course GPT unchanged (and leave repr alone).
    qkv_bias: bool = False  # a bias on the q, k and v projections (Qwen2); wo and the MLP never have one
    head_dim_override: int | None = None  # None: d_model // n_heads; Gemma's heads are 256 wide whatever d_model
    post_norms: bool = False  # Gemma-2: an RMSNorm on the attention's and the MLP's output, before each residual add

    def __post_init__(self):
        if self.head_dim_override is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model={self.d_model} is not a multiple of n_heads={self.n_heads}")
        elif (isinstance(self.head_dim_override, bool) or not isinstance(self.head_dim_override, int)
              or self.head_dim_override < 2 or self.head_dim_override % 2):
            raise ValueError(f"head_dim_override must be None or an even int >= 2 (RoPE rotates pairs), "
                             f"not {self.head_dim_override!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")

    def __repr__(self) -> str:
        # The dataclass's repr, less the options left at their defaults: a course config reads (and keys the
        # grader's reference values, autograder.checks.references) as it did before the options existed.
        shown = [f for f in fields(self) if f.name not in _OPTIONS or getattr(self, f.name) != f.default]
        return f"GPTConfig({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads if self.head_dim_override is None else self.head_dim_override

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of attention's output, wo's input): n_heads * head_dim, d_model unless
        head_dim_override says otherwise."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the keys, and of the values: n_kv_heads * head_dim."""
        return self.n_kv_heads * self.head_dim

    def scaled(self, **changes) -> "GPTConfig":
        return replace(self, **changes)

    @classmethod
    def from_hf_config(cls, path_or_dict: str | Path | dict, name: str | None = None) -> "GPTConfig":
        """The course's GPTConfig for a Hugging Face decoder's config.json: a path to the file, to a folder holding
        it, or its dict already loaded. Reads the file only (no network, no transformers).

        Reads: model_type (llama, mistral, qwen2, gemma, gemma2), hidden_size, intermediate_size,
        num_hidden_layers, num_attention_heads, vocab_size (required); num_key_value_heads (default
        num_attention_heads), head_dim (default hidden_size / num_attention_heads, 256 for gemma and gemma2),
        tie_word_embeddings, rms_norm_eps, rope_theta (or rope_parameters' rope_theta, where transformers 5
        writes it), max_position_embeddings (defaults: the transformers class's own for the model_type, e.g. gemma2
        ties its embeddings unless told otherwise); attention_bias and mlp_bias (refused when true: the course GPT
        has no bias on wo or the MLP); architectures (refused unless every entry is a ...ForCausalLM: another head
        has other parameters). Qwen2's q/k/v biases and Gemma-2's four norms per
        layer come with the model_type (transformers hard-codes them; no field says so).

        Ignores, as the memory of training does not depend on them (the parameters are the same): torch_dtype (the
        plan chooses the precision), hidden_act (GELU and SiLU gates have the same shapes), rope_scaling, sliding
        windows (sliding_window, use_sliding_window, max_window_layers, cache_implementation), Gemma-2's
        attn_logit_softcapping, final_logit_softcapping and query_pre_attn_scalar, Gemma's embedding scale and
        (1 + weight) norms, dropout, initializer_range, token ids, use_cache, transformers_version. Note that
        soft-capping and sliding windows change what a real attention kernel or loss computes, not the parameters.

        Raises ValueError naming the file (or "config dict") and the problem: not JSON, not a JSON object, a
        required field missing or not a positive int, sizes GPTConfig refuses (heads that the key/value heads do
        not divide), a mixture of experts (num_local_experts, num_experts, n_routed_experts, ...) or a model_type
        it cannot represent, with the field and the model_type; FileNotFoundError for a path with no file.
        `name` (default: the file's name, its folder's for config.json, or _name_or_path) names the config.
        """
        if isinstance(path_or_dict, dict):
            where, data = "config dict", path_or_dict
            default_name = data.get("_name_or_path") or data.get("model_type") or ""
        elif isinstance(path_or_dict, (str, Path)):
            path = Path(path_or_dict)
            if path.is_dir():
                path = path / "config.json"
            where = str(path)
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                raise FileNotFoundError(f"{where}: no such file (a Hugging Face config.json, or its folder)") from None
            except UnicodeDecodeError as e:
                raise ValueError(f"{where}: not a JSON file (not UTF-8 text: {e})") from None
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not a JSON file ({e})") from None
            default_name = path.parent.name if path.name == "config.json" else path.stem
        else:
            raise TypeError(f"from_hf_config takes a path to a config.json or a dict, "
                            f"not {type(path_or_dict).__name__}")
        if not isinstance(data, dict):
            raise ValueError(f"{where}: a config.json holds a JSON object of fields, not a {type(data).__name__}")
        values = _hf_fields(data, where)
        try:
            return cls(**values, name=default_name if name is None else name)
        except ValueError as e:  # e.g. heads that the key/value heads do not divide
            raise ValueError(f"{where}: {e} (model_type {data['model_type']!r})") from None


_OPTIONS = ("qkv_bias", "head_dim_override", "post_norms")

# What each model_type's transformers class assumes for a field its config.json leaves out, and what it hard-codes.
_HF_MODEL_TYPES: dict[str, dict[str, Any]] = {
    "llama": dict(tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10_000.0, max_position_embeddings=2048),
    "mistral": dict(tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10_000.0,
                    max_position_embeddings=4096 * 32),
    "qwen2": dict(tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10_000.0, max_position_embeddings=32_768,
                  qkv_bias=True),
    "gemma": dict(tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=10_000.0, max_position_embeddings=8192,
                  head_dim=256),
    "gemma2": dict(tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=10_000.0, max_position_embeddings=8192,
                   head_dim=256, post_norms=True),
}
# Fields that make a config a mixture of experts (Mixtral, Qwen-MoE, OLMoE, DeepSeek, ...).
_HF_EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
                     "moe_intermediate_size", "n_shared_experts")


def _hf_fields(data: dict, where: str) -> dict:
    """GPTConfig's fields from a config.json's (see GPTConfig.from_hf_config)."""
    model_type = data.get("model_type")
    for key in _HF_EXPERT_FIELDS:
        if data.get(key):
            raise ValueError(f"{where}: {key}={data[key]!r} makes model_type {model_type!r} a mixture of experts, "
                             f"which the course GPT (one dense MLP per block) cannot represent")
    if model_type is None:
        raise ValueError(f"{where}: the field model_type is missing (one of {sorted(_HF_MODEL_TYPES)})")
    if not isinstance(model_type, str) or model_type not in _HF_MODEL_TYPES:
        raise ValueError(f"{where}: model_type {model_type!r} is not one the course GPT represents "
                         f"({', '.join(sorted(_HF_MODEL_TYPES))}: Llama-style decoders)")
    known = _HF_MODEL_TYPES[model_type]
    architectures = data.get("architectures") or []
    if not isinstance(architectures, list) or any(not str(a).endswith("ForCausalLM") for a in architectures):
        raise ValueError(f"{where}: architectures={architectures!r} (model_type {model_type!r}): the course GPT is "
                         f"a causal language model with an output head over the vocabulary (...ForCausalLM)")
    for key in ("attention_bias", "mlp_bias"):
        if data.get(key):
            raise ValueError(f"{where}: {key}=true (model_type {model_type!r}): the course GPT has no bias on "
                             f"{'the attention projections' if key == 'attention_bias' else 'the MLP'}")

    def count(key: str, default: Any = None) -> int:
        if key not in data or data[key] is None:
            if default is None:
                raise ValueError(f"{where}: the field {key} is missing (model_type {model_type!r})")
            return default
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: the field {key} must be a positive int, not {value!r}")
        return value

    def number(key: str) -> float:
        value = data.get(key)
        if key == "rope_theta" and value is None and isinstance(data.get("rope_parameters"), dict):
            value = data["rope_parameters"].get("rope_theta")  # where transformers 5 writes it
        value = known[key] if value is None else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{where}: the field {key} must be a positive number, not {value!r}")
        return float(value)

    hidden, heads = count("hidden_size"), count("num_attention_heads")
    head_dim = count("head_dim", known.get("head_dim", hidden // heads))
    tie = data.get("tie_word_embeddings", known["tie_word_embeddings"])
    if not isinstance(tie, bool):
        raise ValueError(f"{where}: the field tie_word_embeddings must be true or false, not {tie!r}")
    return dict(vocab_size=count("vocab_size"), d_model=hidden, n_layers=count("num_hidden_layers"), n_heads=heads,
                n_kv_heads=count("num_key_value_heads", heads), ffn_hidden=count("intermediate_size"),
                tie_embeddings=tie, max_seq_len=count("max_position_embeddings", known["max_position_embeddings"]),
                norm_eps=number("rms_norm_eps"), rope_theta=number("rope_theta"),
                qkv_bias=known.get("qkv_bias", False),
                head_dim_override=None if head_dim * heads == hidden else head_dim,
                post_norms=known.get("post_norms", False))


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
        self.wqkv = nn.Linear(cfg.d_model, cfg.q_dim + 2 * cfg.kv_dim, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.q_dim, cfg.d_model, bias=False)

    def forward(self, x, cos, sin):
        cfg, (b, s, _) = self.cfg, x.shape
        kv = cfg.kv_dim
        q, k, v = self.wqkv(x).split([cfg.q_dim, kv, kv], dim=-1)
        q = apply_rope(q.view(b, s, cfg.n_heads, cfg.head_dim), cos, sin)
        k = apply_rope(k.view(b, s, cfg.n_kv_heads, cfg.head_dim), cos, sin)
        v = v.view(b, s, cfg.n_kv_heads, cfg.head_dim)
        if cfg.n_kv_heads != cfg.n_heads:  # grouped-query: each K/V head serves n_heads / n_kv_heads queries
            k = k.repeat_interleave(cfg.n_heads // cfg.n_kv_heads, dim=2)
            v = v.repeat_interleave(cfg.n_heads // cfg.n_kv_heads, dim=2)
        y = self.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.wo(y.transpose(1, 2).reshape(b, s, cfg.q_dim))


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
        self.post_norms = cfg.post_norms
        if cfg.post_norms:  # Gemma-2's sandwich: each sublayer's output normalized before the residual add
            self.attn_out_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
            self.mlp_out_norm = RMSNorm(cfg.d_model, cfg.norm_eps)

    def forward(self, x, cos, sin):
        if self.post_norms:
            x = x + self.attn_out_norm(self.attn(self.norm1(x), cos, sin))
            return x + self.mlp_out_norm(self.mlp(self.norm2(x)))
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


def _selective_policy():
    """Op-level selective recomputation: keep what is expensive to recompute (matmuls, attention),
    recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    aten = torch.ops.aten
    keep = {aten.mm.default, aten.addmm.default,  # addmm: a projection with a bias (qkv_bias)
            aten._scaled_dot_product_flash_attention.default,
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
        if isinstance(module, nn.Linear) and module.bias is not None:  # qkv_bias: zeros, as transformers starts them
            nn.init.zeros_(module.bias)

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


def n_params_of_config(cfg: GPTConfig) -> int:
    """Parameters of the course GPT `cfg` describes, counted on a model built on the meta device: shapes and no
    storage, so a 70B count costs no memory."""
    with torch.device("meta"):
        return n_params(GPT(cfg))
