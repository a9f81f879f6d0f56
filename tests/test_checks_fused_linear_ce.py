"""Lesson 06: the checks pass the reference and report stubs as not implemented (the registry's mutants and
alternatives run in tests/test_registry_entries.py)."""
import pytest
import torch

from course import ROOT
from autograder.checks import NotImplementedYet
from autograder.checks import fused_linear_ce as checks
from course.notebook_loader import load_notebook, load_solution

ref = load_solution("06_fused_linear_ce")

# (check, the name of the lesson's function it takes)
CHECKS = [(checks.check_cross_entropy_with_grad, "cross_entropy_with_grad"),
          (checks.check_chunked_linear_ce, "chunked_linear_ce"),
          (checks.check_fused_linear_ce_forward, "fused_linear_ce_forward"),
          (checks.check_fused_linear_ce_memory, "fused_linear_ce_forward"),
          (checks.check_fused_linear_cross_entropy, "fused_linear_cross_entropy")]


@pytest.mark.parametrize("check, name", CHECKS, ids=[check.__name__ for check, _ in CHECKS])
def test_reference_passes_every_case(check, name):
    check(getattr(ref, name), cases="all")


def test_stubs_are_reported_not_implemented():
    stub = load_notebook(ROOT / "lessons" / "06_fused_linear_ce.ipynb").module
    for check, name in CHECKS:
        with pytest.raises(NotImplementedYet):
            check(getattr(stub, name))


def _tile_block_maxima(grad, chunks, bm, bn):
    """((t0, v0, a, b), the largest |entry| of each bm x bn block of that tile) for each tile of chunks = (C, Vc)."""
    (tokens, columns), (n, v) = chunks, grad.shape
    for t0 in range(0, n, tokens):
        for v0 in range(0, v, columns):
            tile = grad[t0:t0 + tokens, v0:v0 + columns].abs()
            a, b = tile.shape
            padded = torch.nn.functional.pad(tile, (0, -b % bn, 0, -a % bm))
            yield (t0, v0, a, b), padded.view(padded.shape[0] // bm, bm, padded.shape[1] // bn, bn).amax(dim=(1, 3))


def _blocks_kept(grad, chunks, bm, bn, threshold):
    """Per entry of an (N, V) gradient: whether its block (bm x bn, within tiles of chunks = (C, Vc)) has an entry
    at or above threshold."""
    keep = torch.zeros_like(grad, dtype=torch.bool)
    for (t0, v0, a, b), maxima in _tile_block_maxima(grad, chunks, bm, bn):
        big = maxima >= threshold
        keep[t0:t0 + a, v0:v0 + b] = big.repeat_interleave(bm, 0).repeat_interleave(bn, 1)[:a, :b]
    return keep


def _threshold_between_blocks(grad, chunks, bm, bn) -> float:
    """A threshold halfway (in log) across the widest gap between the blocks' largest |entries| near their median:
    a fifth to four fifths of the blocks kept, none within rounding of the line (fp16 logits are off by up to
    about 0.25% in a softmax value: a gap of 1% leaves 0.5% either side)."""
    m = torch.cat([maxima.flatten() for _, maxima in _tile_block_maxima(grad, chunks, bm, bn)])
    m = m[m > 0].sort().values
    middle = m[len(m) // 5: 4 * len(m) // 5]
    gaps = middle[1:] / middle[:-1]
    i = int(gaps.argmax())
    assert gaps[i] > 1.01, "no block maxima far enough apart to draw a line between them"
    return float((middle[i] * middle[i + 1]).sqrt())


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_filtered_linear_ce_skips_exactly_the_blocks_below_eps(dtype):
    """filtered_linear_ce_forward (given, section 8): the loss is fused_linear_ce_forward's; dX and dW are the
    products of the gradient with exactly the blocks below filter_eps zeroed (tiles across part of a row and whole
    rows, ignored tokens, a bias, smoothing, a softcap, a sum); filter_eps=0 keeps every block; the call allocates
    no more than the fused loss plus one byte per block; a negative or NaN filter_eps is refused. The interpreter's
    small blocks on a GPU too, so that these short tiles hold many blocks (the benchmark's error column covers the
    GPU's own blocks at full size)."""
    from memfit.hardware import borrowed_configs
    with borrowed_configs("cpu", ("ce_blocks",)):
        _check_filtered(getattr(torch, dtype))


def _check_filtered(dtype):
    from memfit.hardware import config
    from memfit.meter import measure_peak
    device = checks.memfit.DEVICE
    blocks = config("ce_blocks")
    bm, bn = blocks["BLOCK_M"], blocks["BLOCK_N"]
    gen = torch.Generator().manual_seed(3)
    n, h, v = 40, 32, 400
    x = torch.randn(n, h, generator=gen).to(device, dtype)
    w = (torch.randn(v, h, generator=gen) / h**0.5)
    w[: v // 10] *= 5  # a few likely columns: blocks with large entries beside blocks of small ones
    w = w.to(device, dtype)
    bias = (torch.randn(v, generator=gen) * 0.1).to(device, dtype)
    targets = torch.randint(0, v // 10, (n,), generator=gen).to(device)  # among the likely columns: most blocks
    targets[::6] = ref.IGNORE_INDEX  # hold no target, so their largest entries are softmax values, spread out
    for chunks, kwargs in (((32, 150), {}), ((32, 150), dict(bias=bias, label_smoothing=0.1)),
                           ((64, v), dict(softcap=3.0, reduction="sum"))):
        loss_all, dx_all, dw_all, db_all = ref.fused_linear_ce_forward(x, w, targets, chunks=chunks, **kwargs)
        b = kwargs.get("bias")
        logits = x.double() @ w.double().T + (0 if b is None else b.double())
        shape_of_loss = {k: val for k, val in kwargs.items() if k in ("label_smoothing", "softcap")}
        _, grad = ref.cross_entropy_with_grad(logits, targets, reduction="sum", **shape_of_loss)
        eps = _threshold_between_blocks(grad, chunks, bm, bn)
        for filter_eps in (0.0, eps):
            loss, dx, dw, db = ref.filtered_linear_ce_forward(x, w, targets, chunks=chunks, filter_eps=filter_eps,
                                                              **kwargs)
            kept = _blocks_kept(grad, chunks, bm, bn, filter_eps)
            assert 0.15 < kept.double().mean() < 0.85 or filter_eps == 0, kept.double().mean()
            scale = 1 / int((targets != ref.IGNORE_INDEX).sum()) if kwargs.get("reduction", "mean") == "mean" else 1
            g = torch.where(kept, grad, 0.0) * scale
            assert torch.allclose(loss, loss_all, rtol=1e-6, atol=0), (loss, loss_all)
            # as close to the float64 products of the kept blocks as the fused loss's dX and dW are to all blocks'
            for got, got_all, want, want_all in ((dx, dx_all, g @ w.double(), grad * scale @ w.double()),
                                                 (dw, dw_all, g.T @ x.double(), (grad * scale).T @ x.double())):
                tol = 2 * (got_all.double() - want_all).abs().max() + 8 * torch.finfo(dtype).eps * want.abs().max()
                assert (got.double() - want).abs().max() <= tol, (chunks, filter_eps, kwargs)
                if filter_eps > 0 and dtype == torch.float32:  # the case tells a filter from none: the skipped
                    # products exceed the tolerance (in fp16 they are below its rounding, Cut Cross-Entropy's point)
                    assert (got.double() - got_all.double()).abs().max() > tol
            if b is not None:  # the bias's gradient sums every entry: no block is skipped there
                assert torch.allclose(db.double(), db_all.double(), rtol=0, atol=8 * torch.finfo(dtype).eps)
    chunks = (32, 150)
    _, peak_all = measure_peak(ref.fused_linear_ce_forward, x, w, targets, chunks=chunks, warmup=checks.memfit.HAS_GPU)
    _, peak = measure_peak(ref.filtered_linear_ce_forward, x, w, targets, chunks=chunks, warmup=checks.memfit.HAS_GPU)
    flag_bytes = -(-min(chunks[0], n) // bm) * -(-min(chunks[1], v) // bn)
    assert peak.peak_bytes <= peak_all.peak_bytes + flag_bytes + 512, (peak.peak_bytes, peak_all.peak_bytes)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="filter_eps"):
            ref.filtered_linear_ce_forward(x, w, targets, filter_eps=bad)
