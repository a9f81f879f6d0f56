"""The course's layers point one way (ARCHITECTURE.md): memfit, the library learners import, imports nothing above
it (its generated lesson answers, memfit.from_lessons, sit just above its core); course (paths, the lessons, what
grading adds to a notebook, process trees) imports only memfit; autograder and benchmarks import those two and not
each other; the decks and the tools sit above them, since they present or verify the whole course (a deck quotes its
lesson's checks, points and cases from the grader itself, the one source; make lessons holds each notebook to its
CHECKS; compile_targets compiles the kernels a check module lists); tests import anything. No two modules import each
other. Imports inside functions count: they run too."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("memfit", "course", "autograder", "benchmarks", "slides", "tools", "tests")
LAYER = {"memfit": 0, "memfit.from_lessons": 1, "course": 2, "autograder": 3, "benchmarks": 3, "slides": 4, "tools": 4,
         "tests": 5}


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


def problems(graph: dict[str, set[str]]) -> list[str]:
    """Every arrow that points up or sideways, every pair of modules that import each other."""
    found = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            if layer(b) > layer(a):
                found.append(f"{a} imports {b}, a layer above it")
            elif layer(b) == layer(a) and top(a) != top(b) and top(a) != "tests":
                found.append(f"{a} imports {b}, beside it (only the layers below are its to import)")
            if a < b and a in graph.get(b, ()):
                found.append(f"{a} and {b} import each other")
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
    (("autograder.runner", "benchmarks.record"), "autograder.runner imports benchmarks.record, beside it"),
    (("autograder.runner", "slides.build"), "autograder.runner imports slides.build, a layer above it"),
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
