"""Lesson 07's Q8_0 and Q4_0 write the bytes llama.cpp writes, block for block.

The oracle is the `gguf` package (pinned in requirements.txt): llama.cpp's own Python library, whose gguf.quants
reproduces ggml-quants.c's reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref) in NumPy. Compared
with it, byte for byte: the lesson's reference kernels (the solution notebook, through Triton's interpreter here)
and the grader's own rule (autograder.checks.quantization.llama_quantize), on Gaussian, heavy-tailed, tied-extreme,
exact-half, near-half, tiny-value and zero blocks, and on the edges of the number formats (EDGE_KINDS: subnormal
values, scales at the edge where 1 / d overflows to inf, multiples of the smallest subnormal, subnormal and normal
values in one block, signed zeros, the largest magnitudes), in fp32, fp16 and bf16. Infinities and NaNs are left
out: the lesson's text says nothing of them, and gguf parts from ggml-quants.c itself on a NaN (NumPy's max and
argmax make it the block's extreme; the C's Q4_0 scan skips it, its Q8_0 MAX drops it at the next value). A GPU is
not available to these tests: the last one compiles the reference kernels for sm_75 and checks their PTX for the
two instructions that would change codes there (an approximate division, an fma).
"""
import json
import math
import platform
import subprocess
import sys

import numpy as np
import pytest
import torch

import memfit

gguf = pytest.importorskip("gguf", reason="skipped: gguf is not installed (make test installs it)")
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402
from gguf.quants import quantize as gguf_quantize  # noqa: E402

from course import ROOT, course_env  # noqa: E402
from autograder.checks import quantization as checks  # noqa: E402
from course.notebook_loader import load_solution  # noqa: E402

ref = load_solution("07_quantization")
QTYPES = {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
KINDS = ["gaussian", "heavy", "tied", "ties", "near", "tiny", "negative", "zeros"]
EDGE_KINDS = ["subnormal", "overflow_edge", "min_subnormal", "mixed", "signed_zeros", "largest"]
QK = checks.QK


def edge_weights(kind: str, shape, seed: int, fmt: str, dtype: torch.dtype) -> torch.Tensor:
    """Blocks at the edges of `dtype`'s range, in `dtype` (finite values only; a whole number of blocks).
    subnormal: Gaussian blocks scaled from just under the smallest normal down to a few smallest subnormals.
    overflow_edge: blocks whose extreme (Q8_0: 127 · 2^-128; Q4_0: ±2^-125) is moved by -8 .. +8 units of `dtype`'s
    last place, so that d = m / 127 or m / -8 lies on either side of 2^-128, where 1 / d overflows to inf in fp32
    (fp16 has no such values: its blocks are zeros). min_subnormal: small multiples of the smallest subnormal (x86's
    conversion of x · id = ±inf or NaN is what llama.cpp writes there). mixed: subnormal values beside an extreme
    from 2^-20 to 2^30 times the smallest normal (at most the largest value). signed_zeros: blocks of -0.0, of
    ±0.0, and Gaussian or subnormal blocks with -0.0 among their values. largest: extremes of `dtype`'s largest
    magnitude, half of it, and (Q8_0: 127 ×, Q4_0: 8 ×) 65504 and 65520, where the fp16 scale rounds to 65504 or
    overflows to inf."""
    gen = torch.Generator().manual_seed(seed)
    info = torch.finfo(dtype)
    blocks = math.prod(shape) // QK
    assert blocks * QK == math.prod(shape)
    g = torch.randn(blocks, QK, generator=gen, dtype=torch.float64)
    sign = torch.where(torch.rand(blocks, 1, generator=gen) < 0.5, -1.0, 1.0).double()
    b = torch.arange(blocks)[:, None]
    smallest = info.tiny * info.eps  # the smallest subnormal of dtype
    if kind == "subnormal":
        w = g * 0.25 * info.tiny * 2.0 ** -(b % (int(-math.log2(info.eps)) + 1)).double()
    elif kind == "overflow_edge":
        base = 127 * 2.0**-128 if fmt == "q8_0" else 2.0**-125
        k = (b % 17 - 8).double()
        extreme = sign * base * (1 + torch.where(k < 0, k / 2, k) * info.eps) if dtype != torch.float16 else \
            sign * base
        w = extreme * torch.rand(blocks, QK, generator=gen, dtype=torch.float64).mul(1.98).sub(0.99)
        w[:, 0] = extreme[:, 0]
        w = w[:, torch.randperm(QK, generator=gen)]
    elif kind == "min_subnormal":
        w = torch.randint(-40, 41, (blocks, QK), generator=gen).double() * smallest
        w[0] = torch.where(torch.rand(QK, generator=gen) < 0.5, -smallest, smallest)
    elif kind == "mixed":
        e = torch.tensor([-20, -8, -3, -1, 0, 1, 2, 3, 4, 6, 10, 30]).double()[b % 12]
        extreme = sign * (info.tiny * 2.0**e).clamp(max=info.max)
        w = torch.where(torch.rand(blocks, QK, generator=gen) < 0.5, g * smallest * 1000,
                        extreme * torch.rand(blocks, QK, generator=gen, dtype=torch.float64))
        w[:, 5] = extreme[:, 0]
    elif kind == "signed_zeros":
        w = torch.where(b % 4 == 3, g * 0.25 * info.tiny * 2.0**-4, g * 0.02)
        w = torch.where(torch.rand(blocks, QK, generator=gen) < 0.3, -0.0, w)
        w[0::4] = -0.0
        w[1::4] = torch.where(torch.rand(QK, generator=gen) < 0.5, -0.0, 0.0).double()
    elif kind == "largest":
        spread = 127 if fmt == "q8_0" else 8
        tops = torch.tensor([info.max, info.max / 2, spread * 65504.0, spread * 65520.0]).double()
        extreme = sign * tops[b % 4].clamp(max=info.max)
        w = extreme * torch.rand(blocks, QK, generator=gen, dtype=torch.float64).mul(2).sub(1)
        w[:, 3] = extreme[:, 0]
    else:
        raise ValueError(kind)
    return w.to(dtype).reshape(shape)


# Where 1 / d overflows, llama.cpp's bytes are those of x86's conversion of ±inf and NaN to an integer (0), which C
# leaves undefined; elsewhere NumPy, and so gguf, may convert them otherwise (Arm's conversions saturate)
X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
needs_x86 = pytest.mark.skipif(not X86, reason="gguf's bytes where 1 / d overflows are x86's (C leaves them undefined)")


def make_weights(kind: str, shape, seed: int, fmt: str, dtype: str) -> torch.Tensor:
    if kind in EDGE_KINDS:
        if kind != "largest" and dtype != "fp16" and not X86:
            pytest.skip("gguf's bytes where 1 / d overflows are x86's (C leaves them undefined)")
        w = edge_weights(kind, shape, seed, fmt, DTYPES[dtype])
        assert torch.isfinite(w).all()
        return w
    return checks.weights(kind, shape, seed, fmt).to(DTYPES[dtype])


def quiet():
    """Where 1 / d overflows, NumPy (in gguf, and in Triton's interpreter) warns of the overflow and of converting
    ±inf or NaN to an integer: the very steps the tests compare, expected there."""
    return np.errstate(over="ignore", invalid="ignore")


def oracle(fmt: str, w: torch.Tensor) -> np.ndarray:
    """gguf's blocks of w (its values in fp32, the last block padded with zeros): uint8 (blocks, 34 or 18).

    gguf gets x + 0.0, which turns -0.0 into +0.0 and changes nothing else: on a Q4_0 block of zeros whose first
    value is -0.0, NumPy's argmax makes that -0.0 the block's m (d = +0.0), where ggml-quants.c's scan keeps its
    initial +0.0 (d = -0.0, bytes 00 80); the lesson follows the C. No decoder reads the sign of a zero scale."""
    flat = checks.in_blocks(w.detach().reshape(-1).float().cpu() + 0.0).numpy()
    with quiet():
        return gguf_quantize(flat, QTYPES[fmt]).reshape(flat.shape[0], -1)


def lesson_bytes(fmt: str, w: torch.Tensor) -> np.ndarray:
    """The lesson's kernels' blocks of w, run where the course runs them (a GPU when there is one)."""
    with quiet():
        return ref.gguf_bytes(getattr(ref, f"quantize_{fmt}")(w.to(memfit.DEVICE))).cpu().numpy()


def grader_bytes(fmt: str, w: torch.Tensor) -> np.ndarray:
    """The grader's expected scales and codes, laid out as GGUF blocks."""
    rule = checks.llama_quantize(fmt, w)
    codes = rule.codes
    data = codes.to(torch.int8) if fmt == "q8_0" else (codes[:, :16] | (codes[:, 16:] << 4)).to(torch.uint8)
    return torch.cat([rule.scales.view(torch.uint8).view(-1, 2), data.view(torch.uint8)], dim=1).cpu().numpy()


def first_difference(ours: np.ndarray, theirs: np.ndarray) -> str:
    b = int(np.nonzero((ours != theirs).any(axis=1))[0][0])
    return f"{int((ours != theirs).any(axis=1).sum())} of {len(ours)} blocks differ; block {b}:\n" \
           f"  ours   {ours[b].tobytes().hex(' ')}\n  gguf's {theirs[b].tobytes().hex(' ')}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS + EDGE_KINDS)
@pytest.mark.parametrize("fmt", QTYPES)
def test_the_lessons_kernels_write_gguf_bytes(fmt, kind, dtype):
    w = make_weights(kind, (24, 32), 7, fmt, dtype)
    ours, theirs = lesson_bytes(fmt, w), oracle(fmt, w)
    assert ours.shape == theirs.shape == (24, 34 if fmt == "q8_0" else 18)
    assert np.array_equal(ours, theirs), first_difference(ours, theirs)


@pytest.mark.parametrize("fmt", QTYPES)
def test_a_partial_last_block_is_padded_with_zeros(fmt):
    w = checks.weights("heavy", (101,), 3, fmt)  # 3 whole blocks and 5 values
    ours, theirs = lesson_bytes(fmt, w), oracle(fmt, w)
    assert np.array_equal(ours, theirs), first_difference(ours, theirs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS + EDGE_KINDS)
@pytest.mark.parametrize("fmt", QTYPES)
def test_the_graders_rule_is_gguf(fmt, kind, dtype):
    w = make_weights(kind, (64, 32), 11, fmt, dtype)
    ours, theirs = grader_bytes(fmt, w), oracle(fmt, w)
    assert np.array_equal(ours, theirs), first_difference(ours, theirs)


@pytest.mark.parametrize("fmt", QTYPES)
def test_the_graders_rule_is_gguf_on_many_blocks(fmt):
    """200,000 blocks each of Gaussian, heavy-tailed and near-half values: every rounding path of the rule."""
    for kind in ("gaussian", "heavy", "near"):
        w = checks.weights(kind, (200_000, 32), 5, fmt)
        ours, theirs = grader_bytes(fmt, w), oracle(fmt, w)
        assert np.array_equal(ours, theirs), f"{kind}: " + first_difference(ours, theirs)


def across_the_smallest_scales(blocks: int, seed: int) -> torch.Tensor:
    """fp32 blocks whose extreme is 2^e with e uniform in [-149, -100] (random mantissa and sign): their d runs
    from 0 through the subnormals, across 2^-128, where 1 / d overflows, into the normals. Each block's other
    values are the extreme times a uniform fraction, a third of them divided by 2^0 .. 2^30 besides."""
    gen = torch.Generator().manual_seed(seed)
    e = torch.randint(-149, -99, (blocks, 1), generator=gen).double()
    sign = torch.where(torch.rand(blocks, 1, generator=gen) < 0.5, -1.0, 1.0).double()
    extreme = sign * 2.0**e * (1 + torch.rand(blocks, 1, generator=gen, dtype=torch.float64))
    w = extreme * torch.rand(blocks, QK, generator=gen, dtype=torch.float64).mul(2).sub(1)
    smaller = torch.rand(blocks, QK, generator=gen) < 1 / 3
    w = torch.where(smaller, w * 2.0 ** -torch.randint(0, 31, (blocks, QK), generator=gen).double(), w)
    w[:, 0] = extreme[:, 0]
    w = w.float()  # the extremes' mantissas rounded to fp32 (or to fewer bits among the subnormals)
    return w[:, torch.randperm(QK, generator=gen)]


@needs_x86
@pytest.mark.parametrize("fmt", QTYPES)
def test_subnormal_scales_write_gguf_bytes(fmt):
    """The kernels (1,024 blocks) and the grader's rule (100,000 blocks) against gguf where the scales are smallest:
    where 1 / d overflows every code is 0, as llama.cpp and gguf write on x86; elsewhere the usual rule."""
    for who, blocks, seed, write in (("kernels", 1024, 13, lesson_bytes),
                                     ("grader's rule", 100_000, 17, grader_bytes)):
        w = across_the_smallest_scales(blocks, seed)
        ours, theirs = write(fmt, w), oracle(fmt, w)
        assert np.array_equal(ours, theirs), f"{who}: " + first_difference(ours, theirs)
        d = checks.llama_quantize(fmt, w).d
        overflows = ((d != 0) & torch.isinf(1 / d)).numpy()
        assert 0.2 < overflows.mean() < 0.8  # the sample lies on both sides of 2^-128
        assert not theirs[overflows, 2:].any() and theirs[~overflows, 2:].any()


@pytest.mark.parametrize("fmt", QTYPES)
def test_dequantize_is_gguf_in_fp32(fmt):
    w = checks.weights("heavy", (40, 32), 9, fmt)
    qt = getattr(ref, f"quantize_{fmt}")(w.to(memfit.DEVICE))
    ours = getattr(ref, f"dequantize_{fmt}")(qt).reshape(-1).cpu().numpy()
    theirs = gguf_dequantize(lesson_bytes(fmt, w), QTYPES[fmt]).reshape(-1)
    assert np.array_equal(ours, theirs)


def test_the_edge_of_roundf():
    """v = 0.5 - 2^-25: roundf gives 0, floor(v + 0.5) in fp32 gives 1 (v + 0.5 rounds up to 1). Both gguf and the
    lesson give 0."""
    w = torch.zeros(32)
    w[0], w[1], w[2] = 127 * 2.0**-7, (0.5 - 2.0**-25) * 2.0**-7, -(0.5 - 2.0**-25) * 2.0**-7  # d = 2^-7
    assert (torch.tensor(0.5 - 2.0**-25, dtype=torch.float32) + 0.5).item() == 1.0
    ours, theirs = lesson_bytes("q8_0", w), oracle("q8_0", w)
    assert np.array_equal(ours, theirs) and ours[0, 3] == ours[0, 4] == 0


PTX_PROBE = r"""
import json, os, sys
os.environ["TRITON_INTERPRET"] = "0"  # real JITFunctions: compile for a GPU this machine does not have
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from autograder.checks.quantization import KERNELS
from course.notebook_loader import load_solution
from memfit.hardware import config, profile_for
ref = load_solution("07_quantization")
cfg = config("quant_blocks", profile_for("t4"))
found = {}
for spec in KERNELS:
    if not spec.kernel.endswith("_quantize_kernel"):
        continue
    for launch, extra in (("lesson", ref.BLOCK_LAUNCH_OPTIONS), ("triton's default", {})):
        options = {"num_warps": cfg["num_warps"], **extra}
        signature = {name: t.format(dtype="fp32") for name, t in spec.signature.items()} | {"BLOCKS": "constexpr"}
        src = ASTSource(getattr(ref, spec.kernel), signature, {"BLOCKS": cfg["BLOCKS"]})
        ptx = triton.compile(src, target=GPUTarget("cuda", 75, 32), options=options).asm["ptx"]
        found[f"{spec.kernel}, {launch}"] = sorted(
            {op for op in ("div.rn.f32", "div.full.f32", "div.approx", "rcp.approx", "fma.rn.f32") if op in ptx})
print(json.dumps(found))
"""


@pytest.mark.slow
def test_on_a_gpu_the_kernels_divide_exactly_and_never_fuse():
    """What the lesson relies on for exact codes on a GPU, checked in the PTX for sm_75: tl.math.div_rn compiles to
    div.rn.f32 (Triton's / would be div.full.f32), and launch_blocks' enable_fp_fusion=False leaves no fma (with
    Triton's default, Q4_0's x * id + 8.5 becomes one)."""
    run = subprocess.run([sys.executable, "-c", PTX_PROBE], cwd=ROOT, env=course_env(), capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert ref.BLOCK_LAUNCH_OPTIONS == {"enable_fp_fusion": False}
    for name, ops in found.items():
        assert "div.rn.f32" in ops and not {"div.full.f32", "div.approx", "rcp.approx"} & set(ops), (name, ops)
        if name.endswith("lesson"):
            assert "fma.rn.f32" not in ops, (name, ops)
    assert "fma.rn.f32" in found["q4_0_quantize_kernel, triton's default"], "the probe no longer sees the fusion"
