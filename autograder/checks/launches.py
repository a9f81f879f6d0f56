"""What a kernel launch does on a GPU that Triton's interpreter hides: the order its programs run in, and its options.

- **Program order.** A GPU runs a grid's programs in any order, many at once; the interpreter runs them one by one,
  in order. Code whose result depends on that order (programs adding into one shared row with atomics: the sum's
  order, and so its bits, changes from run to run) gives the same bits on every interpreted run. Inside
  `programs_in_another_order()` the interpreter runs every grid backwards, so a second call shows what a GPU would:
  other bits. On a GPU the block changes nothing (its own order already varies).
- **Launch options.** `launched_warps()` records the `num_warps` of each launch of a learner kernel (on a GPU and in
  the interpreter alike), for exercises whose text says how to choose it.
"""
from __future__ import annotations

import contextlib

import torch

import memfit
from autograder.checks.gpu_compile import _from_learner
from autograder.checks.numerics import same_bits

DEFAULT_WARPS = 4  # Triton's num_warps when a launch does not give one
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


@contextlib.contextmanager
def programs_in_another_order():
    """Within the block, Triton's interpreter runs each grid's programs last first (a permutation of the program ids:
    every program still runs once)."""
    if not memfit.INTERPRETED:
        yield
        return
    from triton.runtime.interpreter import InterpreterBuilder
    set_grid_idx = InterpreterBuilder.set_grid_idx

    def last_first(self, x, y, z):
        nx, ny, nz = self.grid_dim
        flat = (nx * ny * nz - 1) - ((x * ny + y) * nz + z)
        set_grid_idx(self, flat // (ny * nz), (flat // nz) % ny, flat % nz)

    InterpreterBuilder.set_grid_idx = last_first
    try:
        yield
    finally:
        InterpreterBuilder.set_grid_idx = set_grid_idx


def differs_in_another_order(fn, args: tuple, first, names: tuple[str, ...]) -> str | None:
    """Call fn(*args) again with its programs in another order (twice more on a GPU, whose order varies by itself)
    and compare each returned tensor's bits with `first`'s: the name of the first that changed, or None."""
    runs = 1 if memfit.INTERPRETED else 2
    for _ in range(runs):
        with programs_in_another_order():
            again = fn(*args)
        for name, a, b in zip(names, first, again):
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and not same_bits(a, b):
                return name
    return None


@contextlib.contextmanager
def launched_warps():
    """A list that fills, within the block, with (kernel name, num_warps, block) for each launch of a learner kernel:
    block is the largest power of two of 16 or more among the launch's keyword arguments (its BLOCK, however named),
    or None."""
    from triton.runtime.jit import JITFunction
    kinds = [JITFunction]
    if memfit.INTERPRETED:
        from triton.runtime.interpreter import InterpretedFunction
        kinds.append(InterpretedFunction)
    seen: list[tuple[str, int]] = []
    originals = {kind: kind.run for kind in kinds}

    def recorder(run):
        def recording(self, *args, grid, warmup, **kwargs):
            if _from_learner(self.fn):
                warps = kwargs.get("num_warps")
                blocks = [v for k, v in kwargs.items() if k not in _OPTIONS and type(v) is int and v >= 16
                          and v & (v - 1) == 0]
                seen.append((self.fn.__name__, warps if isinstance(warps, int) else DEFAULT_WARPS,
                             max(blocks, default=None)))
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        return recording

    for kind, run in originals.items():
        kind.run = recorder(run)
    try:
        yield seen
    finally:
        for kind, run in originals.items():
            kind.run = run
