"""The course's layers point one way (ARCHITECTURE.md): memfit, the library learners import, imports nothing above
it (its generated lesson answers, memfit.from_lessons, sit just above its core); course (paths, the lessons, a
notebook loaded as a module) imports only memfit; autograder, benchmarks and slides import those two and not each
other; tools, which build and verify the course from every layer (make lessons holds each notebook to its CHECKS,
compile_targets compiles the kernels a check module lists), sit above them; tests import anything. No two modules
import each other. Imports inside functions count: they run too."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("memfit", "course", "autograder", "benchmarks", "slides", "tools", "tests")
LAYER = {"memfit": 0, "memfit.from_lessons": 1, "course": 2, "autograder": 3, "benchmarks": 3, "slides": 3, "tools": 4,
         "tests": 5}

# Arrows that still point the wrong way, each with what it is for; issue 26 removes them. The test fails on any arrow
# not listed and on a listed one that is gone, so the list can only shrink.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}
KNOWN_SIDEWAYS = {
    ("slides.figures.01_model_states", "autograder.checks"): "the deck quotes the check's cases",
    ("slides.figures.01_model_states", "autograder.checks.model_states"): "the deck quotes the check's cases",
    ("slides.figures.02_activations", "autograder.checks.activations"): "the deck quotes the check's cases",
    ("slides.figures.03_zero", "autograder.checks.zero"): "the deck quotes the check's cases",
    ("slides.figures.04_kernel_fusion", "autograder.checks.kernel_fusion"): "the deck quotes the check's cases",
    ("slides.figures.05_flash_attention", "autograder.checks.flash_attention"): "the deck quotes the check's cases",
    ("slides.figures.06_fused_linear_ce", "autograder.checks.fused_linear_ce"): "the deck quotes the check's cases",
    ("slides.figures.07_quantization", "autograder.checks.quantization"): "the deck quotes the check's cases",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def course_modules() -> dict[str, Path]:
    return {module_name(p): p for top in PACKAGES for p in (ROOT / top).rglob("*.py")}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The course modules `name` imports, anywhere in its file: `from a.b import c` is a.b.c when that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(filter(None, [*package.split(".")[:len(package.split(".")) - node.level + 1], base]))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # import a.b.c of a package a.b: the module a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer(module: str) -> int:
    return max(v for k, v in LAYER.items() if module == k or module.startswith(k + "."))


def top(module: str) -> str:
    return "memfit.from_lessons" if module.startswith("memfit.from_lessons") else module.split(".")[0]


def problems(graph: dict[str, set[str]], known_upward=None, known_sideways=None) -> list[str]:
    """Every arrow that points up or sideways and is not known, every known one that is gone, every pair of modules
    that import each other."""
    known_upward = KNOWN_UPWARD if known_upward is None else known_upward
    known_sideways = KNOWN_SIDEWAYS if known_sideways is None else known_sideways
    found, seen = [], set()
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            if layer(b) > layer(a):
                seen.add((a, b))
                if (a, b) not in known_upward:
                    found.append(f"{a} imports {b}, a layer above it")
            elif layer(b) == layer(a) and top(a) != top(b) and top(a) != "tests":
                seen.add((a, b))
                if (a, b) not in known_sideways:
                    found.append(f"{a} imports {b}, beside it (only the layers below are its to import)")
            if a < b and a in graph.get(b, ()):
                found.append(f"{a} and {b} import each other")
    found += [f"{a} -> {b} is listed as known but no longer imported: take it off the list"
              for a, b in sorted((set(known_upward) | set(known_sideways)) - seen)]
    return found


def graph_of_course() -> dict[str, set[str]]:
    modules = course_modules()
    return {name: imports(name, path, set(modules)) for name, path in modules.items()}


def test_every_import_points_down_and_no_two_modules_import_each_other():
    found = problems(graph_of_course())
    assert not found, "\n".join(found)


@pytest.mark.parametrize("planted, expected", [
    (("memfit.meter", "autograder.checks"), "memfit.meter imports autograder.checks, a layer above it"),
    (("memfit.gpt", "memfit.from_lessons.zero"), "memfit.gpt imports memfit.from_lessons.zero, a layer above it"),
    (("course.notebook_loader", "autograder.sandbox"), "a layer above it"),
    (("autograder.runner", "slides.build"), "autograder.runner imports slides.build, beside it"),
    (("autograder.runner", "tools.make_lessons"), "autograder.runner imports tools.make_lessons, a layer above it"),
])
def test_a_planted_upward_or_sideways_import_fails(planted, expected):
    graph = graph_of_course()
    a, b = planted
    graph[a] = graph[a] | {b}
    assert any(expected in line for line in problems(graph)), problems(graph)


def test_a_planted_cycle_fails():
    graph = graph_of_course()
    graph["memfit.gpt"] = graph["memfit.gpt"] | {"memfit.meter"}
    graph["memfit.meter"] = graph["memfit.meter"] | {"memfit.gpt"}
    assert "memfit.gpt and memfit.meter import each other" in problems(graph)
