"""tests/mutants/registry.py cannot drift: it names every check of every lesson, every name in it exists, and
every name is exercised by the per-lesson tests (tests/test_checks_*.py), which are what prove that a wrong
entry loses the check's points and a right one keeps them. Nothing here runs a check."""
import ast
import importlib
from pathlib import Path

import pytest

from autograder.checks import checks_for
from tests.mutants.registry import LESSONS, REF, REGISTRY, as_mapping, mutant_module, mutant_names

ROOT = Path(__file__).resolve().parent.parent
TEST_FILES = sorted((ROOT / "tests").glob("test_checks_*.py"))


def exercised_names() -> dict[str, set[str]]:
    """{mutant module: the attributes of it that some test_checks_*.py file refers to}: `alias.name` where alias
    is bound by `from tests.mutants import topic as alias` or `import tests.mutants.topic as alias`."""
    found: dict[str, set[str]] = {}
    for path in TEST_FILES:
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "tests.mutants":
                aliases.update({a.asname or a.name: f"tests.mutants.{a.name}" for a in node.names})
            elif isinstance(node, ast.Import):
                aliases.update({a.asname: a.name for a in node.names if a.asname and a.name.startswith("tests.mutants.")})
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                found.setdefault(aliases[node.value.id], set()).add(node.attr)
    return found


EXERCISED = exercised_names()


def test_every_lesson_and_every_check_is_registered():
    lessons = sorted(p.stem for p in (ROOT / "solutions").glob("*.ipynb"))
    assert lessons == list(LESSONS) == list(REGISTRY)
    for lesson in LESSONS:
        names = [c.name for c in checks_for(lesson)]
        assert list(REGISTRY[lesson]) == names, f"{lesson}: registry {list(REGISTRY[lesson])}, CHECKS {names}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_entries_are_well_formed_and_exist(lesson):
    module = importlib.import_module(mutant_module(lesson))
    for check in checks_for(lesson):
        entries = REGISTRY[lesson][check.name]
        assert set(entries) == {"wrong", "right"}, f"{lesson}/{check.name}: keys {set(entries)}"
        assert entries["wrong"], f"{lesson}/{check.name}: no mutant must fail it"
        for verdict in ("wrong", "right"):
            for entry in entries[verdict]:
                if len(check.uses) == 1:
                    assert isinstance(entry, str) and entry != REF, f"{lesson}/{check.name}: {entry!r}"
                mapping = as_mapping(entry, check.uses)  # raises when the keys are not exactly check.uses
                assert mutant_names(entry), f"{lesson}/{check.name}: {entry!r} names no mutant"
                for name in mutant_names(mapping):
                    assert callable(getattr(module, name, None)), f"{mutant_module(lesson)} has no callable {name}"
            assert len({repr(as_mapping(e, check.uses)) for e in entries[verdict]}) == len(entries[verdict]), \
                f"{lesson}/{check.name}: a {verdict} entry is listed twice"
        wrong = {repr(as_mapping(e, check.uses)) for e in entries["wrong"]}
        right = {repr(as_mapping(e, check.uses)) for e in entries["right"]}
        assert not wrong & right, f"{lesson}/{check.name}: listed both wrong and right: {wrong & right}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_registered_name_is_exercised_by_the_lesson_tests(lesson):
    module = mutant_module(lesson)
    tested = EXERCISED.get(module, set())
    assert tested, f"no tests/test_checks_*.py file imports {module}"
    for check, entries in REGISTRY[lesson].items():
        for verdict in ("wrong", "right"):
            for entry in entries[verdict]:
                for name in mutant_names(entry):
                    assert name in tested, (f"{lesson}/{check}: {verdict} entry {name} is not run by any "
                                            f"tests/test_checks_*.py test (no `mutants.{name}` there)")


@pytest.mark.parametrize("lesson, check, entry", [
    ("05_flash_attention", "online_softmax", "softmax_stats_without_rescale"),  # online softmax without the rescale
    ("05_flash_attention", "attention_tiled", "tiled_causal_sees_next_key"),  # causal mask off by one
    ("05_flash_attention", "attention_tiled", "tiled_causal_masks_diagonal"),  # ... the other way
    ("06_fused_linear_ce", "cross_entropy_with_grad", "ce_mean_over_all_tokens"),  # mean over ignored tokens too
    ("03_zero", "shard_bounds", "shard_bounds_off_by_one"),  # a shard boundary off by one
    ("01_model_states", "state_bytes", "state_bytes_no_master"),  # master weights forgotten
    ("07_quantization", "q8_0", {"quantize_q8_0": "q8_scale_from_mean", "dequantize_q8_0": "q8_dequantize"}),
])
def test_the_issues_examples_are_registered(lesson, check, entry):
    """The mutants issue 10 names, each against the check it must fail."""
    assert entry in REGISTRY[lesson][check]["wrong"]
