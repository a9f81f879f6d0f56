"""Lesson 03: the checks pass the reference, count what a rank keeps, and report stubs as not implemented (the
registry's mutants and alternatives run in tests/test_registry_entries.py). Also pins the figures the lesson
reproduces (the ZeRO paper's 120/31.4/16.6/1.9 GB, DeepSpeed's 5.70/179.49/18.78 GiB)."""
import pytest

from autograder.checks import CheckFailed, NotImplementedYet
from autograder.checks import zero as checks
from course.notebook_loader import load_notebook, load_solution
from course import ROOT
from tests.mutants import zero as mutants

ref = load_solution("03_zero")


def test_reference_passes_every_case():
    checks.check_shard_bounds(ref.shard_bounds, cases="all")
    checks.check_zero_adamw(ref.ZeroAdamW, cases="all")
    checks.check_zero_memory(ref.ZeroAdamW, cases="all")
    checks.check_zero_bytes_per_rank(ref.zero_bytes_per_rank, cases="all")
    checks.check_comm_bytes_per_rank(ref.comm_bytes_per_rank, cases="all")
    checks.check_deepspeed_estimate(ref.deepspeed_zero3_estimate, cases="all")
    checks.check_prefetch_timeline(ref.prefetch_timeline, cases="all")


def test_reference_passes_on_gloo_processes():
    checks.check_zero_on_gloo(ref.ZeroAdamW, ref.zero_bytes_per_rank, cases="all")


def test_paper_and_deepspeed_figures():
    gb = [round(ref.zero_bytes_per_rank(s, 7_500_000_000, 64)["total"] / 1e9, 1) for s in range(4)]
    assert gb == [120.0, 31.4, 16.6, 1.9]
    n, largest = checks.LLAMA8B_PARAMS, checks.LLAMA8B_LARGEST
    cpu, gpu = ref.deepspeed_zero3_estimate(n, largest, gpus_per_node=4, offload_params=False)
    assert (round(gpu / 2**30, 2), round(cpu / 2**30, 2)) == (5.70, 179.49)
    _, gpu8 = ref.deepspeed_zero3_estimate(n, largest, gpus_per_node=8, offload_optimizer=False, offload_params=False)
    assert round(gpu8 / 2**30, 2) == 18.78
    for kwargs, which, printed in checks.DEEPSPEED_ESTIMATOR_RUNS:  # what DeepSpeed's estimator prints, as GiB
        cpu, gpu = ref.deepspeed_zero3_estimate(n, largest, **kwargs)
        assert round((cpu if which == "cpu" else gpu) / 2**30, 2) == printed


def test_messages_write_counts_with_thousands_separators():
    assert checks._count(1_000_003) == "1,000,003" and checks._count((0, 2_048)) == "(0, 2,048)"
    assert checks._count(True) == "True" and checks._count(None) == "None" and checks._count(3.5) == "3.5"
    def wrong_when_large(numel, world_size, rank):
        return ref.shard_bounds(numel, world_size, rank) if numel < 1000 else (0, 0)
    with pytest.raises(CheckFailed, match=r"numel=918,144, .*expected \(start, stop\) = \(0, 306,048\)"):
        checks.check_shard_bounds(wrong_when_large, cases="visible")
    assert ref.comm_bytes_per_rank(3, 1024, 8) * 2 == ref.comm_bytes_per_rank(2, 1024, 8) * 3  # 3Ψ against 2Ψ


def test_gloo_check_counts_what_a_rank_keeps():
    """The measured bytes at rest decide, not only the formula: a ZeRO-2 that keeps its full gradient
    fails (and a reference rank's bookkeeping, such as a barrier's tensor, must not count against it)."""
    with pytest.raises(CheckFailed, match="stage 2, .*rank 0: .* bytes alive after a step \\(measured\\)"):
        checks.check_zero_on_gloo(mutants.ZeroStage2KeepsFullGradient, ref.zero_bytes_per_rank, cases="hidden")


def test_stubs_are_reported_not_implemented():
    stub = load_notebook(ROOT / "lessons" / "03_zero.ipynb").module
    for check, names in ((checks.check_shard_bounds, ("shard_bounds",)), (checks.check_zero_adamw, ("ZeroAdamW",)),
                         (checks.check_zero_memory, ("ZeroAdamW",)),
                         (checks.check_zero_on_gloo, ("ZeroAdamW", "zero_bytes_per_rank")),
                         (checks.check_zero_bytes_per_rank, ("zero_bytes_per_rank",)),
                         (checks.check_comm_bytes_per_rank, ("comm_bytes_per_rank",)),
                         (checks.check_deepspeed_estimate, ("deepspeed_zero3_estimate",)),
                         (checks.check_prefetch_timeline, ("prefetch_timeline",))):
        with pytest.raises(NotImplementedYet):
            check(*(getattr(stub, n) for n in names))


def test_simulated_ranks_that_disagree_fail_within_the_limit():
    import torch

    from memfit.zero import SimulationFailed, simulate

    def only_rank_0_reduces(comm):
        if comm.rank == 0:
            comm.all_reduce(torch.ones(4))
        return comm.rank

    with pytest.raises(SimulationFailed, match="never joined"):  # the time limit's message: it stopped the hang
        simulate(2, only_rank_0_reduces, timeout_s=2)

    def rank_1_raises(comm):
        if comm.rank == 1:
            raise KeyError("rank 1's own error")
        comm.all_reduce(torch.ones(4))

    with pytest.raises(KeyError, match="rank 1's own error"):
        simulate(2, rank_1_raises, timeout_s=30)
