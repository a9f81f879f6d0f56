"""autograder/checks/domain.py: cases drawn from an exercise's domain with the class's hidden seed, the same on every
rerun; a failing drawn case shrunk to a smaller one that fails, shown with its own message."""
import pytest

from autograder.checks import CheckFailed, LearnerCodeError, NotImplementedYet, checks_for
from autograder.checks.domain import (HIDDEN_SEED_ENV, MAX_SHRINK_STEPS, Choice, Impossible, Sizes, draws,
                                      grade_drawn, shrink)
from course.notebook_loader import load_solution

DOMAIN = {"n": Sizes(1, 5000, edges=(1, 1023, 1024, 1025)), "dtype": Choice("float32", "float16", "bfloat16"),
          "rank": Choice(1, 2, 3)}


def test_a_draw_is_the_same_for_the_same_seed_and_differs_for_another(monkeypatch):
    monkeypatch.setenv(HIDDEN_SEED_ENV, "7")
    first = list(draws(DOMAIN, "some_check", 20))
    assert first == list(draws(DOMAIN, "some_check", 20, seed=7))
    assert first != list(draws(DOMAIN, "some_check", 20, seed=8))
    assert first != list(draws(DOMAIN, "another_check", 20))
    assert all(1 <= c["n"] <= 5000 and c["dtype"] in DOMAIN["dtype"].values for c in first)


def test_draws_reach_the_whole_range_and_its_edges():
    seen = [c["n"] for c in draws(DOMAIN, "some_check", 400, seed=1)]
    assert {1, 1023, 1024, 1025} <= set(seen)
    assert min(seen) == 1 and max(seen) > 2500
    assert {c["dtype"] for c in draws(DOMAIN, "some_check", 100, seed=1)} == set(DOMAIN["dtype"].values)


def test_sizes_widen_to_hold_their_edges():
    """An edge computed from a kernel config (a GPU's block of 2,048) widens a range written for the CPU's."""
    sizes = Sizes(1, 300, edges=(0, 31, 2049))
    assert (sizes.lo, sizes.hi) == (0, 2049)
    with pytest.raises(ValueError, match="lo must not exceed hi"):
        Sizes(10, 1)


def test_shrinking_finds_a_smaller_failing_case_within_its_step_count():
    runs = []

    def failure(case):
        runs.append(case)
        return f"wrong at n={case['n']}" if case["n"] >= 700 and case["dtype"] != "float32" else None
    case, message = shrink({"n": 4999, "dtype": "bfloat16", "rank": 3, "seed": 5}, DOMAIN, failure)
    assert len(runs) <= MAX_SHRINK_STEPS
    assert case["n"] < 4999 and case["n"] >= 700 and case["dtype"] == "float16" and case["rank"] == 1
    assert message == f"wrong at n={case['n']}"


def _check_one_failing(kind=CheckFailed):
    def check_one(case):
        if case["n"] > 1024 and case["rank"] >= 2:
            raise kind(f"got a wrong value at n={case['n']}")
    return check_one


def test_a_failing_drawn_case_raises_the_same_kind_with_the_smallest_case_found(monkeypatch):
    monkeypatch.setenv(HIDDEN_SEED_ENV, "3")
    for kind in (CheckFailed, LearnerCodeError):
        with pytest.raises(kind, match=r"hidden seed 3\); the smallest failing case found: n=\d+, dtype=float32, "
                                       r"rank=2: got a wrong value at n=\d+") as info:
            grade_drawn(DOMAIN, "some_check", 40, _check_one_failing(kind))
        assert type(info.value) is kind
        assert int(str(info.value).split("n=")[1].split(",")[0]) > 1024


def test_right_answers_stubs_and_impossible_combinations(monkeypatch):
    grade_drawn(DOMAIN, "some_check", 40, lambda case: None)

    def stub(case):
        raise NotImplementedYet("not implemented yet")
    with pytest.raises(NotImplementedYet, match="^not implemented yet$"):
        grade_drawn(DOMAIN, "some_check", 5, stub)

    def some_impossible(case):
        if case["rank"] == 3:
            raise Impossible()
    grade_drawn(DOMAIN, "some_check", 40, some_impossible)


def test_the_hidden_seed_must_be_an_integer(monkeypatch):
    monkeypatch.setenv(HIDDEN_SEED_ENV, "abc")
    with pytest.raises(ValueError, match="MEMFIT_HIDDEN_SEED='abc': the hidden seed must be an integer"):
        list(draws(DOMAIN, "some_check", 1))


def test_a_mistake_between_the_fixed_sizes_is_caught_by_a_drawn_case_and_shown_shrunk(monkeypatch):
    """Wrong only for sizes between two and three blocks, a range no fixed case of scaled_add_numerics visits: the
    fixed cases pass it, draws with some seeds reach it, and the message gives a failing size in that range."""
    import memfit
    from autograder.checks import first_kernel
    monkeypatch.setenv("MEMFIT_GRADING", "1")
    block = memfit.config("scaled_add")["BLOCK"]
    reference = load_solution("00_first_kernel").scaled_add

    def off_between_two_and_three_blocks(x, y, alpha, out=None):
        result = reference(x, y, alpha, out=out)
        return result.mul_(1.01) if 2 * block < x.numel() < 3 * block else result
    check = next(c for c in checks_for("00_first_kernel") if c.name == "scaled_add_numerics")
    with monkeypatch.context() as fixed_only:
        fixed_only.setattr(first_kernel, "DRAWN_ADD_CASES", 0)
        check.run(off_between_two_and_three_blocks, cases="all")
    caught = []
    for seed in range(6):
        monkeypatch.setenv(HIDDEN_SEED_ENV, str(seed))
        try:
            check.run(off_between_two_and_three_blocks, cases="hidden")
        except CheckFailed as exc:
            caught.append(str(exc))
    assert caught, "no draw of seeds 0-5 reached sizes between two and three blocks"
    for message in caught:
        assert "the smallest failing case found: n=" in message, message
        elements = int(message.split(" elements)")[0].rsplit("(", 1)[1].replace(",", ""))
        assert 2 * block < elements < 3 * block, message


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_lesson_03_comm_bytes_in_float_arithmetic_fails_on_a_drawn_count(seed, monkeypatch):
    """comm_bytes_per_rank over every stage, world size and parameter count: float arithmetic, exact on every fixed
    case (all below 2**53), is wrong for some drawn count above it (the references: tests/test_domain_checks.py)."""
    import math
    monkeypatch.setenv("MEMFIT_GRADING", "1")
    monkeypatch.setenv(HIDDEN_SEED_ENV, str(seed))
    checks = {c.name: c for c in checks_for("03_zero")}

    def comm_bytes_in_floats(stage, numel, world_size, param_bytes=2, grad_bytes=2):
        chunk = (world_size - 1) * math.ceil(numel / world_size)
        if stage not in (0, 1, 2, 3):
            raise ValueError("stage must be 0-3")
        return 2 * chunk * grad_bytes if stage == 0 else chunk * grad_bytes + (2 if stage == 3 else 1) * chunk * param_bytes
    from autograder.checks import zero
    with monkeypatch.context() as fixed_only:
        fixed_only.setattr(zero, "DRAWN_FORMULA_CASES", 0)
        checks["comm_bytes_per_rank"].run(comm_bytes_in_floats, cases="all")
    with pytest.raises(CheckFailed, match="the smallest failing case found: .*above 2\\*\\*53 a float cannot hold"):
        checks["comm_bytes_per_rank"].run(comm_bytes_in_floats, cases="hidden")


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_lesson_02_a_search_capped_at_4096_fails_on_a_drawn_answer(seed, monkeypatch):
    """max_micro_batch over predictors whose answers reach 2**24: a search capped at 4,096 sequences fails."""
    monkeypatch.setenv("MEMFIT_GRADING", "1")
    monkeypatch.setenv(HIDDEN_SEED_ENV, str(seed))
    solution = load_solution("02_activations")
    checks = {c.name: c for c in checks_for("02_activations")}

    def capped(cfg, seq, budget_bytes, precision="amp", optimizer="adamw", recompute="none", predict=None):
        predict = predict or solution.predict_peak
        batch = 0
        while batch < 4096 and predict(cfg, batch + 1, seq, precision, optimizer, recompute)["peak"] <= budget_bytes:
            batch += 1
        return batch
    with pytest.raises(CheckFailed, match="the smallest failing case found: answer=4097"):
        checks["max_micro_batch"].run(capped, cases="hidden")
