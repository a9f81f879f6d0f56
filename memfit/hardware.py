"""Hardware profiles: what the learner's machine is, and the one place that chooses sizes,
dtypes and Triton configs for it.

Profiles: cpu, t4, v100, a100, h100 (H100 and H200: the same SM), other. Lessons never test the
device themselves; they ask `profile()` and read `config(...)` / `size(...)`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from memfit import runtime

KiB = 1024
GiB = 1024**3


@dataclass(frozen=True)
class Profile:
    name: str  # cpu | t4 | v100 | a100 | h100 | other
    gpu_name: str  # what the driver calls it ("" on cpu)
    capability: tuple[int, int] | None  # CUDA compute capability, None on cpu
    total_memory: int  # bytes the device has (host RAM is not reported for cpu)
    shared_memory_per_block: int  # bytes a Triton kernel may use (the opt-in maximum)
    bf16_tensor_cores: bool
    interpreted: bool = field(default=False)  # Triton runs in its interpreter

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        """The dtypes checks and demos run in: bf16 only where the hardware has it."""
        if self.name == "cpu":
            return (torch.float32, torch.float16)
        if self.bf16_tensor_cores:
            return (torch.float32, torch.float16, torch.bfloat16)
        return (torch.float32, torch.float16)

    @property
    def is_gpu(self) -> bool:
        return self.capability is not None

    def describe(self) -> str:
        if not self.is_gpu:
            mode = "Triton interpreter" if self.interpreted else "no Triton"
            return f"cpu (no CUDA GPU): tensors on the CPU, kernels through the {mode}"
        major, minor = self.capability
        return (
            f"{self.name}: {self.gpu_name}, sm_{major}{minor}, {self.total_memory / GiB:.1f} GiB, "
            f"{self.shared_memory_per_block // KiB} KiB shared memory per block, "
            f"bf16 tensor cores: {'yes' if self.bf16_tensor_cores else 'no'}"
        )


# The GPUs the course is written for, by their published limits. `profile_for("t4")` builds a
# profile without the hardware, so tests can compile kernels for cards they do not have.
KNOWN_GPUS: dict[str, dict] = {
    "t4": dict(gpu_name="Tesla T4", capability=(7, 5), total_memory=15 * GiB, shared_memory_per_block=64 * KiB),
    "v100": dict(gpu_name="Tesla V100", capability=(7, 0), total_memory=16 * GiB, shared_memory_per_block=96 * KiB),
    "a100": dict(gpu_name="A100", capability=(8, 0), total_memory=80 * GiB, shared_memory_per_block=163 * KiB),
    "h100": dict(gpu_name="H100", capability=(9, 0), total_memory=80 * GiB, shared_memory_per_block=227 * KiB),
}


def profile_for(name: str) -> Profile:
    """A profile by name, for planning and compile checks on a machine that lacks the card."""
    if name == "cpu":
        return Profile("cpu", "", None, 0, 0, False, interpreted=True)
    if name not in KNOWN_GPUS:
        raise ValueError(f"unknown profile {name!r}; known: cpu, {', '.join(KNOWN_GPUS)}")
    spec = KNOWN_GPUS[name]
    return Profile(name, spec["gpu_name"], spec["capability"], spec["total_memory"],
                   spec["shared_memory_per_block"], spec["capability"] >= (8, 0))


def _name_for(gpu_name: str, capability: tuple[int, int]) -> str:
    upper = gpu_name.upper()
    for key, marker in (("t4", "T4"), ("v100", "V100"), ("a100", "A100")):
        if marker in upper:
            return key
    if capability == (9, 0):  # H100 and H200 share the Hopper SM and its limits
        return "h100"
    return "other"


def detect() -> Profile:
    """The profile of the machine this process runs on."""
    if not runtime.HAS_GPU:
        return Profile("cpu", "", None, 0, 0, False, interpreted=runtime.INTERPRETED)
    props = torch.cuda.get_device_properties(0)
    capability = (props.major, props.minor)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or 48 * KiB
    return Profile(_name_for(props.name, capability), props.name, capability, props.total_memory,
                   smem, capability >= (8, 0), interpreted=runtime.INTERPRETED)


_current: Profile | None = None


def profile() -> Profile:
    """The current machine's profile (detected once per process)."""
    global _current
    if _current is None:
        _current = detect()
    return _current


# ---------------------------------------------------------------------------------------------
# The one table of per-profile choices. A kernel's entry: Triton meta-parameters and launch
# options. A problem's entry: sizes a lesson uses for demos and checks. "gpu" is the fallback for
# any GPU profile without its own row; "cpu" sizes are small because the interpreter runs every
# program one after another in NumPy.
# ---------------------------------------------------------------------------------------------
def _flash_tiles(cpu: tuple, d64: tuple, d128: tuple, h100: tuple) -> dict[str, dict]:
    """One FlashAttention kernel's rows (lesson 05), from (BLOCK_M, BLOCK_N) pairs: cpu's for both head-dim
    classes; d64 and d128 for the cards before Hopper, on one stage for T4 and V100 (no asynchronous copies to
    overlap more) and two elsewhere; h100's (BLOCK_M, BLOCK_N, num_warps, num_stages) for both classes."""
    def tiles(m, n, warps=4, stages=1):
        return dict(BLOCK_M=m, BLOCK_N=n, num_warps=warps, num_stages=stages)
    small = {name: dict(d64=tiles(*d64, 4, stages), d128=tiles(*d128, 4, stages))
             for name, stages in (("t4", 1), ("v100", 1), ("gpu", 2))}
    return dict(cpu=dict(d64=tiles(*cpu), d128=tiles(*cpu)), h100=dict(d64=tiles(*h100), d128=tiles(*h100)), **small)


def _int8_tiles(m16: tuple, m64: tuple, m256: tuple, m_large: tuple) -> dict[str, dict]:
    """Lesson 07's matmul rows, one variant per class of M (rows of x: up to 16, 64, 256, more), each from
    (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages)."""
    keys = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages")
    return dict(m16=dict(zip(keys, m16)), m64=dict(zip(keys, m64)), m256=dict(zip(keys, m256)),
                m_large=dict(zip(keys, m_large)))


KERNEL_CONFIGS: dict[str, dict[str, dict]] = {
    "scaled_add": {
        "cpu": dict(BLOCK=1024, num_warps=4),
        "gpu": dict(BLOCK=1024, num_warps=4),
    },
    # Lesson 04. Elementwise kernels: a block of 1024 elements per program, 4 warps (8 elements a thread).
    "pow4": {
        "cpu": dict(BLOCK=1024, num_warps=4),
        "gpu": dict(BLOCK=1024, num_warps=4),
    },
    "swiglu": {
        "cpu": dict(BLOCK=1024, num_warps=4),
        "gpu": dict(BLOCK=1024, num_warps=4),
    },
    # Row kernels hold a whole row in registers: BLOCK is the longest row they accept (the compile check
    # builds that size; a launch uses the row's next power of two), num_warps the warps at that size.
    # T4 and V100 keep the same: a row reduction needs shared memory only for its cross-warp sums.
    "rmsnorm": {
        "cpu": dict(BLOCK=16384, num_warps=16),
        "gpu": dict(BLOCK=16384, num_warps=16),
    },
    # Lesson 05. FlashAttention tiles, per head-dimension class: "d64" for head dims up to 64, "d128" up to 128
    # (the tile is padded to a power of two). BLOCK_M: queries per tile, BLOCK_N: keys per tile. The loops need
    # the bigger of the two to be a multiple of the smaller (forward and dQ: BLOCK_M % BLOCK_N == 0; dK/dV:
    # BLOCK_N % BLOCK_M == 0). cpu: small unequal tiles, so the checks' short sequences cross every kind of
    # tile (full, ragged, diagonal). t4/v100: sized so fp32 fits 64 and 96 KiB of shared memory (both lack the
    # asynchronous copies that make more pipeline stages pay). h100: the best of benchmarks/flash_attention.py's
    # sweep in bf16 (fp32 fits too). gpu: any other card (A100, consumer cards of about 100 KiB).
    "flash_forward": _flash_tiles(cpu=(32, 16), d64=(64, 64), d128=(64, 32), h100=(128, 64, 8, 3)),
    "flash_dkdv": _flash_tiles(cpu=(16, 32), d64=(32, 64), d128=(16, 32), h100=(64, 64, 4, 2)),
    "flash_dq": _flash_tiles(cpu=(32, 16), d64=(64, 32), d128=(32, 16), h100=(64, 64, 4, 2)),
    # Lesson 06. Row kernels over a tile of logits: one program per row streams BLOCK columns at a time and keeps
    # a few scalars, so shared memory holds only cross-warp sums (any card fits). cpu: a block the checks' short
    # rows cross with a ragged end (the interpreter's time grows with programs x blocks). gpu: 2048 columns and
    # 8 warps, for every card (on an H100 at Gemma-2's head, 2048/4 and 4096/8 and 8192/16 came within 3%).
    "ce_rows": {
        "cpu": dict(BLOCK=256, num_warps=4),
        "gpu": dict(BLOCK=2048, num_warps=8),
    },
    # Lesson 06's beyond section: the gradient's block filter and its block-sparse dX and dW products. BLOCK_M tokens
    # x BLOCK_N columns is the block that is skipped or kept (the unit Cut Cross-Entropy's filter skips); BLOCK_H the
    # slice of H a program owns; SCAN the flags a product kernel loads at once before it visits the active ones.
    # cpu: small blocks and scans, so the tests' short tiles cross ragged edges in every direction. t4/v100: fit 64 and
    # 96 KiB in fp32 on one stage. gpu: a 64 x 128 block (finer blocks skip more), 128 columns of H.
    "ce_blocks": {
        "cpu": dict(BLOCK_M=16, BLOCK_N=32, BLOCK_H=64, SCAN=4, num_warps=4, num_stages=1),
        **{card: dict(BLOCK_M=32, BLOCK_N=64, BLOCK_H=64, SCAN=128, num_warps=4, num_stages=1)
           for card in ("t4", "v100")},
        "gpu": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_H=128, SCAN=128, num_warps=8, num_stages=2),
    },
    # Lesson 07. Block formats: one program quantizes BLOCKS blocks of 32 values (a [BLOCKS, 32] tile). cpu: 4
    # blocks, so the checks' short tensors span several programs and a ragged last one.
    "quant_blocks": {
        "cpu": dict(BLOCKS=4, num_warps=4),
        "gpu": dict(BLOCKS=64, num_warps=4),
    },
    # Lesson 07's fused AdamW8bit step: one program updates BLOCKS blocks of 256 values of one tensor. cpu: 16
    # blocks (the interpreter's time grows with programs: 3x faster than 4; the checks' tensors still span several
    # programs and a ragged last one). gpu: any config took the same time on an H100 (0.622 ms for BLOCKS 1-4 and
    # 2-8 warps on course-small: benchmarks/results/nvidia-h100-80gb-hbm3-2026-11-25-issue27-profiles.md).
    "adamw8bit": {
        "cpu": dict(BLOCKS=16, num_warps=4),
        "gpu": dict(BLOCKS=1, num_warps=2),
    },
    # The weight-only int8 matmul y = x Wᵀ, W in Q8_0: a program computes a BLOCK_N x BLOCK_M tile of yᵀ, stepping
    # BLOCK_K (a multiple of 32) along its SPLIT_K-th of K. Variants by rows of x (memfit.from_lessons'
    # int8_matmul_variant): m16 decoding (the weight's bytes are the time: split K so that every SM reads W), m64
    # and m256 in between, m_large prefill (arithmetic is the time). cpu: small tiles, split K where M is small, so
    # the checks' short cases cross both paths. t4/v100: fit 64 and 96 KiB in fp32 on two stages (make test compiles
    # them).
    "int8_matmul": {
        "cpu": _int8_tiles(m16=(16, 32, 64, 2, 4, 1), m64=(32, 32, 64, 2, 4, 1), m256=(32, 32, 64, 1, 4, 1),
                           m_large=(32, 32, 64, 1, 4, 1)),
        **{card: _int8_tiles(m16=(16, 64, 128, 4, 4, 2), m64=(32, 64, 64, 2, 4, 2), m256=(64, 64, 64, 1, 4, 2),
                             m_large=(64, 64, 64, 1, 4, 2)) for card in ("t4", "v100")},
        "gpu": _int8_tiles(m16=(16, 64, 128, 4, 4, 3), m64=(64, 64, 128, 2, 4, 3), m256=(64, 128, 64, 1, 4, 3),
                           m_large=(128, 128, 64, 1, 4, 3)),
        # the H100 sweep (benchmarks/results/nvidia-h100-80gb-hbm3-2026-11-25-int8-matmul-sweep.md, Llama-3-8B
        # shapes, fp16): 8 slices of K for decoding, 4 and 2 up to 256 rows, large tiles beyond
        "h100": _int8_tiles(m16=(16, 64, 128, 8, 4, 3), m64=(64, 64, 128, 4, 4, 3), m256=(64, 128, 128, 2, 4, 4),
                            m_large=(256, 128, 64, 1, 8, 3)),
    },
    # Lesson 08's NF4 matmul (QLoRA's frozen base), the same variants and tile layout as int8_matmul; BLOCK_K a
    # multiple of 64 (one absmax per 64 values). cpu: small tiles, BLOCK_K 128 on some rows, so short cases cross
    # split and unsplit K and a last step that ends inside BLOCK_K. t4/v100: int8_matmul's rows (they compile within
    # 64 and 96 KiB in fp32). h100: the best of a 192-config sweep on an H200 (fp16, N 14,336, K 4,096): dequantizing,
    # a gather per weight, is the time, so fewer, larger programs along M win from 256 rows.
    "nf4_matmul": {
        "cpu": _int8_tiles(m16=(16, 32, 128, 2, 4, 1), m64=(32, 32, 64, 2, 4, 1), m256=(32, 32, 128, 1, 4, 1),
                           m_large=(32, 32, 64, 1, 4, 1)),
        **{card: _int8_tiles(m16=(16, 64, 128, 4, 4, 2), m64=(32, 64, 64, 2, 4, 2), m256=(64, 64, 64, 1, 4, 2),
                             m_large=(64, 64, 64, 1, 4, 2)) for card in ("t4", "v100")},
        "gpu": _int8_tiles(m16=(16, 64, 128, 4, 4, 3), m64=(64, 64, 128, 2, 4, 3), m256=(64, 128, 64, 1, 4, 3),
                           m_large=(128, 128, 64, 1, 4, 3)),
        "h100": _int8_tiles(m16=(16, 64, 128, 4, 4, 3), m64=(64, 64, 128, 1, 4, 3), m256=(128, 64, 64, 1, 4, 3),
                            m_large=(256, 64, 64, 1, 4, 3)),
    },
}

PROBLEM_SIZES: dict[str, dict[str, dict]] = {
    "first_kernel": {
        "cpu": dict(n_demo=1 << 16, n_check_large=(1 << 16) + 3),
        "gpu": dict(n_demo=1 << 26, n_check_large=(1 << 24) + 3),
    },
    # Lessons 01-02: which course GPT (memfit.gpt.COURSE_CONFIGS) a demo trains, at what batch and length.
    "training_step": {
        "cpu": dict(config="tiny", batch=4, seq=128),
        "gpu": dict(config="small", batch=4, seq=1024),
    },
    # Lesson 05: naive against flash attention as the sequence grows (batch 1, 16 heads of 64). Naive attention's
    # forward + backward needs 2,072 MiB at N = 4096 in bf16 and 8,272 MiB at 8192 (the H100 flash-attention
    # record), twice that in fp32 (GPUs without bf16 tensor cores): the longest run only where it fits. On a CPU
    # the interpreter's flash backward at N = 512 alone took 15 s; three doublings show the slopes as well.
    "attention_memory": {
        "cpu": dict(heads=4, head_dim=32, seqs=(64, 128, 256)),
        "gpu": dict(heads=16, head_dim=64, seqs=(512, 1024, 2048, 4096)),
        "a100": dict(heads=16, head_dim=64, seqs=(512, 1024, 2048, 4096, 8192)),
        "h100": dict(heads=16, head_dim=64, seqs=(512, 1024, 2048, 4096, 8192)),
    },
    # Lesson 06: the output layer the notebook measures. cpu: small enough for the interpreter. gpu: fits a T4
    # with PyTorch's chain upcast to fp32 (about 2.3 GB). a100/h100: Gemma-2-2B's head at 8,192 tokens, where
    # the chain upcast to fp32 needs 24 GB.
    "linear_ce": {
        "cpu": dict(tokens=128, hidden=64, vocab=3000),
        "gpu": dict(tokens=4096, hidden=2048, vocab=32768),
        "a100": dict(tokens=8192, hidden=2304, vocab=256000),
        "h100": dict(tokens=8192, hidden=2304, vocab=256000),
    },
    # Lesson 07: the layer the notebook's int8 matmul multiplies (out_features x in_features, tokens). gpu: a
    # Llama-3-8B MLP projection.
    "int8_matmul": {
        "cpu": dict(tokens=(1, 16, 64), out_features=256, in_features=512),
        "gpu": dict(tokens=(1, 16, 256, 4096), out_features=14336, in_features=4096),
    },
    # Lesson 07's int8_linear (a policy, not a kernel's tiles): from min_rows rows of x on, Ŵ is dequantized
    # slice_bytes at a time into one reused buffer and multiplied by torch.mm (cuBLAS) instead of the fused kernel.
    # gpu: an H200 under CUDA graphs (benchmarks/results/nvidia-h200-2026-11-29-quantization-matmul.md and the sweep
    # before it) had the fused kernel ahead up to 64 rows (1.2-1.35x cuBLAS's time against slices' 1.55-2.1x) and
    # slices ahead from 256 (1.4-2.0x against 2.1-3.1x; 1.25-1.33x against 2.2x at 1,024); 64 MiB slices beat 32
    # and 16 at every shape. cpu: 33 rows and 128 KiB, so the demo's 64 rows take several slices.
    "int8_prefill": {
        "cpu": dict(min_rows=33, slice_bytes=128 << 10),
        "gpu": dict(min_rows=65, slice_bytes=64 << 20),
    },
}


def _pick(table: dict[str, dict[str, dict]], key: str, prof: Profile | None) -> dict:
    if key not in table:
        raise KeyError(f"no entry {key!r}; known: {', '.join(sorted(table))}")
    rows = table[key]
    prof = prof or profile()
    if prof.name in rows:
        return dict(rows[prof.name])
    return dict(rows["gpu" if prof.is_gpu else "cpu"])


_borrowed: dict[str, Profile] = {}  # kernel -> the profile whose row config() gives this machine (borrowed_configs)


def config(kernel: str, prof: Profile | None = None) -> dict:
    """Triton meta-parameters for `kernel` on `prof` (default: this machine, or the row borrowed for it)."""
    return _pick(KERNEL_CONFIGS, kernel, prof or _borrowed.get(kernel))


@contextlib.contextmanager
def borrowed_configs(card: str, kernels: tuple[str, ...]):
    """Inside, config(kernel) answers with `card`'s row for these kernels: code written against the table runs
    here with the meta-parameters another machine would give it. A kernel must be right for every row (lesson
    05's checks run the attention kernels with the interpreter's unequal tiles on a GPU whose own are square)."""
    saved = dict(_borrowed)
    _borrowed.update({kernel: profile_for(card) for kernel in kernels})
    try:
        yield
    finally:
        _borrowed.clear()
        _borrowed.update(saved)


def size(problem: str, prof: Profile | None = None) -> dict:
    """Problem sizes of `problem` on `prof` (default: this machine)."""
    return _pick(PROBLEM_SIZES, problem, prof)
