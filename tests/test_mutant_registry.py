"""tests/mutants/registry.py cannot drift: it names every check of every lesson, every name in it exists, and every
entry is well formed (tests/test_registry_entries.py runs each one through its check). Nothing here runs a check."""
import importlib
import re

import pytest

from autograder.checks import CASES, CheckFailed, checks_for
from tests.mutants.registry import (LESSONS, REF, REGISTRY, Right, Wrong, as_mapping, label, mutant_module,
                                    mutant_names)


def test_every_lesson_and_every_check_is_registered():
    """A check is graded only once it is proven: a new one fails here, named, until its wrong implementations (and
    any right alternatives) are registered."""
    assert list(REGISTRY) == list(LESSONS), f"REGISTRY's lessons {list(REGISTRY)} should be solutions/'s {LESSONS}"
    for lesson in LESSONS:
        names = [c.name for c in checks_for(lesson)]
        for name in [n for n in names if n not in REGISTRY[lesson]]:
            pytest.fail(f"{lesson}: the check {name!r} has no entry in tests/mutants/registry.py: add the wrong "
                        f"implementations it must reject to {mutant_module(lesson).replace('.', '/')}.py and name "
                        "them there, with the message each must earn (Wrong), so make test proves the check fails")
        assert list(REGISTRY[lesson]) == names, f"{lesson}: registry {list(REGISTRY[lesson])}, CHECKS {names}"


def assert_well_formed(where: str, entry, verdict: str) -> None:
    """A Wrong in "wrong", a Right in "right"; a compilable message and an exception class the checks raise."""
    if verdict == "wrong":
        assert isinstance(entry, Wrong), f"{where}: {entry!r} should be a Wrong"
        re.compile(entry.message)
        assert entry.message, f"{where}: {entry!r} names no message"
        assert isinstance(entry.raises, type) and issubclass(entry.raises, CheckFailed), f"{where}: {entry.raises}"
    else:
        assert isinstance(entry, Right), f"{where}: {entry!r} should be a Right"
        assert entry.cases in CASES, f"{where}: cases {entry.cases!r}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_entries_are_well_formed_and_exist(lesson):
    module = importlib.import_module(mutant_module(lesson))
    for check in [c for c in checks_for(lesson) if c.name in REGISTRY[lesson]]:  # the rest: the test above
        entries = REGISTRY[lesson][check.name]
        where = f"{lesson}/{check.name}"
        assert set(entries) == {"wrong", "right"}, f"{where}: keys {set(entries)}"
        assert entries["wrong"], f"{where}: no mutant must fail it"
        for verdict in ("wrong", "right"):
            for entry in entries[verdict]:
                assert_well_formed(where, entry, verdict)
                if len(check.uses) == 1:
                    assert isinstance(entry.functions, str) and entry.functions != REF, f"{where}: {entry!r}"
                mapping = as_mapping(entry, check.uses)  # raises when the keys are not exactly check.uses
                assert mutant_names(entry), f"{where}: {entry!r} names no mutant"
                for name in mutant_names(mapping):
                    assert callable(getattr(module, name, None)), f"{mutant_module(lesson)} has no callable {name}"
            labels = [label(e) for e in entries[verdict]]  # the test ids: one entry, one id
            assert len(set(labels)) == len(labels), f"{where}: a {verdict} entry is listed twice: {labels}"
        wrong = {repr(as_mapping(e, check.uses)) for e in entries["wrong"]}
        right = {repr(as_mapping(e, check.uses)) for e in entries["right"]}
        assert not wrong & right, f"{where}: listed both wrong and right: {wrong & right}"


@pytest.mark.parametrize("lesson, check, functions", [
    ("05_flash_attention", "online_softmax", "softmax_stats_without_rescale"),  # online softmax without the rescale
    ("05_flash_attention", "attention_tiled", "tiled_causal_sees_next_key"),  # causal mask off by one
    ("05_flash_attention", "attention_tiled", "tiled_causal_masks_diagonal"),  # ... the other way
    ("06_fused_linear_ce", "cross_entropy_with_grad", "ce_mean_over_all_tokens"),  # mean over ignored tokens too
    ("03_zero", "shard_bounds", "shard_bounds_off_by_one"),  # a shard boundary off by one
    ("01_model_states", "state_bytes", "state_bytes_no_master"),  # master weights forgotten
    ("07_quantization", "q8_0", {"quantize_q8_0": "q8_scale_from_mean", "dequantize_q8_0": "q8_dequantize"}),
])
def test_the_issues_examples_are_registered(lesson, check, functions):
    """The mutants issue 10 names, each against the check it must fail."""
    assert functions in [entry.functions for entry in REGISTRY[lesson][check]["wrong"]]


def test_a_held_out_blind_set_outside_the_repository_runs_as_the_blind_set_does(tmp_path, monkeypatch):
    """BLIND_DIR: a held-out set (kept outside the repository, in tests/mutants/blind/'s form) is run by the same
    runner: its entries are listed from its own BLIND table, and a wrong one loses its check's points."""
    from tests.mutants.blind import run
    (tmp_path / "first_kernel.py").write_text(
        "def bytes_of_always_zero(t):\n    return 0\n\n"
        "BLIND = {'bytes_of': {'wrong': ['bytes_of_always_zero'], 'right': []}}\n")
    monkeypatch.setenv("BLIND_DIR", str(tmp_path))
    listed = [(check.name, verdict, entry) for check, verdict, entry in run.entries("00_first_kernel")]
    assert listed == [("bytes_of", "wrong", "bytes_of_always_zero")]
    check = listed and next(c for c, _, _ in run.entries("00_first_kernel"))
    outcome, _ = run.run_entry("00_first_kernel", check, "bytes_of_always_zero")
    assert outcome in ("failed", "error")
