"""Where the course decides how Triton runs: compiled on a GPU, interpreted on a CPU.

Triton reads TRITON_INTERPRET when it is imported, so this module must run before the first
`import triton`. Every notebook's first code cell imports memfit for that reason.
"""
from __future__ import annotations

import os
import sys

import torch

HAS_GPU: bool = torch.cuda.is_available()

if "TRITON_INTERPRET" not in os.environ and not HAS_GPU:
    if "triton" in sys.modules:
        raise RuntimeError(
            "triton was imported before memfit, so it cannot switch to its CPU interpreter. "
            "Restart the kernel and run the notebook's first cell (import memfit) before anything else."
        )
    os.environ["TRITON_INTERPRET"] = "1"

#: True when Triton kernels run in Triton's interpreter (no GPU, or forced for debugging).
INTERPRETED: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

#: The device the course puts tensors on.
DEVICE: torch.device = torch.device("cuda" if HAS_GPU else "cpu")


def cpu_share() -> int:
    """The cores this process may use: MEMFIT_CPUS where something shares the machine out (the course's test
    runner gives each of its workers a share), else every core. Thread pools sized past it oversubscribe the
    machine, and PyTorch's CPU kernels then run many times slower."""
    return max(1, int(os.environ.get("MEMFIT_CPUS", "0")) or os.cpu_count() or 1)


if os.environ.get("MEMFIT_CPUS"):  # a share given out (make test's workers and whatever they start): keep to it
    torch.set_num_threads(cpu_share())
