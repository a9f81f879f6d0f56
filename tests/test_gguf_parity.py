"""Lesson 07's Q8_0 and Q4_0 write the bytes llama.cpp writes, block for block.

The oracle is the `gguf` package (pinned in requirements.txt): llama.cpp's own Python library, whose gguf.quants
reproduces ggml-quants.c's reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref) in NumPy. Compared
with it, byte for byte: the lesson's reference kernels (the solution notebook, through Triton's interpreter here)
and the grader's own rule (autograder.checks.quantization.llama_quantize), on Gaussian, heavy-tailed, tied-extreme,
exact-half, near-half, tiny-value and zero blocks, in fp32, fp16 and bf16. A GPU is not available to these tests:
the last one compiles the reference kernels for sm_75 and checks their PTX for the two instructions that would
change codes there (an approximate division, an fma).
"""
import json
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
# Run each reference kernel once now, at collection: Triton's interpreter reads a kernel's source at its first
# launch, through linecache, where solutions/ and lessons/ register their cells under the same names
# ("<07_quantization.ipynb cell N>"); a test that loads the lesson's stubs first would hand it the stub's source.
for _fmt in ("q8_0", "q4_0"):
    getattr(ref, f"dequantize_{_fmt}")(getattr(ref, f"quantize_{_fmt}")(torch.ones(40, device=memfit.DEVICE)))
QTYPES = {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
KINDS = ["gaussian", "heavy", "tied", "ties", "near", "tiny", "negative", "zeros"]


def oracle(fmt: str, w: torch.Tensor) -> np.ndarray:
    """gguf's blocks of w (its values in fp32, the last block padded with zeros): uint8 (blocks, 34 or 18).

    gguf gets x + 0.0, which turns -0.0 into +0.0 and changes nothing else: on a Q4_0 block of zeros whose first
    value is -0.0, NumPy's argmax makes that -0.0 the block's m (d = +0.0), where ggml-quants.c's scan keeps its
    initial +0.0 (d = -0.0, bytes 00 80); the lesson follows the C. No decoder reads the sign of a zero scale."""
    flat = checks.in_blocks(w.detach().reshape(-1).float().cpu() + 0.0).numpy()
    return gguf_quantize(flat, QTYPES[fmt]).reshape(flat.shape[0], -1)


def lesson_bytes(fmt: str, w: torch.Tensor) -> np.ndarray:
    """The lesson's kernels' blocks of w, run where the course runs them (a GPU when there is one)."""
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
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", QTYPES)
def test_the_lessons_kernels_write_gguf_bytes(fmt, kind, dtype):
    w = checks.weights(kind, (24, 32), 7, fmt).to(DTYPES[dtype])
    ours, theirs = lesson_bytes(fmt, w), oracle(fmt, w)
    assert ours.shape == theirs.shape == (24, 34 if fmt == "q8_0" else 18)
    assert np.array_equal(ours, theirs), first_difference(ours, theirs)


@pytest.mark.parametrize("fmt", QTYPES)
def test_a_partial_last_block_is_padded_with_zeros(fmt):
    w = checks.weights("heavy", (101,), 3, fmt)  # 3 whole blocks and 5 values
    ours, theirs = lesson_bytes(fmt, w), oracle(fmt, w)
    assert np.array_equal(ours, theirs), first_difference(ours, theirs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", QTYPES)
def test_the_graders_rule_is_gguf(fmt, kind, dtype):
    w = checks.weights(kind, (64, 32), 11, fmt).to(DTYPES[dtype])
    ours, theirs = grader_bytes(fmt, w), oracle(fmt, w)
    assert np.array_equal(ours, theirs), first_difference(ours, theirs)


@pytest.mark.parametrize("fmt", QTYPES)
def test_the_graders_rule_is_gguf_on_many_blocks(fmt):
    """200,000 blocks each of Gaussian, heavy-tailed and near-half values: every rounding path of the rule."""
    for kind in ("gaussian", "heavy", "near"):
        w = checks.weights(kind, (200_000, 32), 5, fmt)
        ours, theirs = grader_bytes(fmt, w), oracle(fmt, w)
        assert np.array_equal(ours, theirs), f"{kind}: " + first_difference(ours, theirs)


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
