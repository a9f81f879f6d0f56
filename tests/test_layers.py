"""The course's layers point one way (ARCHITECTURE.md): memfit, the library learners import, imports nothing above
it (its generated lesson answers, memfit.from_lessons, sit just above its core); course (paths, the lessons, what
grading adds to a notebook, process trees) imports only memfit; autograder and benchmarks import those two and not
each other; the decks and the tools sit above them, since they present or verify the whole course (a deck quotes its
lesson's checks, points and cases from the grader itself, the one source; make lessons holds each notebook to its
CHECKS; compile_targets compiles the kernels a check module lists); tests import anything. No modules import one
another around a loop, of two modules or of more (a package and its own submodules aside). Imports inside functions
count: they run too. And the library does not name its generated lesson code even in a string (a default, an
example): what runs lesson code names it from above (the Makefile, a check, a benchmark)."""
import ast
import functools
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


def counts_for_cycles(a: str, b: str) -> bool:
    """Every arrow but a package's to its own submodule and back (importing a.b runs a's __init__ first anyway)."""
    return not (b.startswith(a + ".") or a.startswith(b + "."))


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted, in order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def cycle_through(start: str, graph: dict[str, set[str]], members: set[str]) -> list[str]:
    """The shortest loop from `start` back to it within `members`: [start, ..., start]."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph.get(v, set()) & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in came_from:
                    came_from[w] = v
                    following.append(w)
        frontier = following
    raise ValueError(f"{start} is on no loop within {sorted(members)}")


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each loop of imports, of any length, as a chain "a -> b -> c -> a": one per strongly connected component,
    through its first module, naming the component's other modules when the chain does not pass them all."""
    arrows = {a: {b for b in targets if counts_for_cycles(a, b)} for a, targets in graph.items()}
    found = []
    for members in strongly_connected(arrows):
        chain = cycle_through(members[0], arrows, set(members))
        line = f"import cycle: {' -> '.join(chain)}"
        others = [m for m in members if m not in chain]
        if others:
            line += f" (and {', '.join(others)} on other loops among the same modules)"
        found.append(line)
    return found


def problems(graph: dict[str, set[str]]) -> list[str]:
    """Every arrow that points up or sideways, every loop of modules importing one another."""
    found = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            if layer(b) > layer(a):
                found.append(f"{a} imports {b}, a layer above it")
            elif layer(b) == layer(a) and top(a) != top(b) and top(a) != "tests":
                found.append(f"{a} imports {b}, beside it (only the layers below are its to import)")
    return found + cycles(graph)


def is_library(module: str) -> bool:
    return top(module) == "memfit"


def lesson_code_named(module: str, source: str) -> list[str]:
    """The strings of a library module (memfit, not memfit.from_lessons) that name generated lesson code: a default
    "memfit.from_lessons.zero:ZeroAdamW" ties the library to a lesson as surely as an import does."""
    if not is_library(module):
        return []
    return [f"{module}, line {node.lineno}, names generated lesson code in a string: {node.value!r}"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value.startswith("memfit.from_lessons")]


@functools.lru_cache(maxsize=1)
def _graph_of_course() -> tuple[tuple[str, frozenset[str]], ...]:
    modules = course_modules()
    return tuple((name, frozenset(imports(name, path, set(modules)))) for name, path in modules.items())


def graph_of_course() -> dict[str, set[str]]:
    """The course's import graph, parsed once per test run: a fresh copy for each test to plant arrows in."""
    return {name: set(targets) for name, targets in _graph_of_course()}


def test_every_import_points_down_and_no_modules_import_one_another_around_a_loop():
    found = problems(graph_of_course())
    assert not found, "\n".join(found)


def test_the_library_names_no_generated_lesson_code_even_in_a_string():
    found = [line for name, path in sorted(course_modules().items())
             for line in lesson_code_named(name, path.read_text())]
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


def test_a_planted_cycle_of_two_fails():
    graph = graph_of_course()
    graph["memfit.gpt"] = graph["memfit.gpt"] | {"memfit.meter"}
    graph["memfit.meter"] = graph["memfit.meter"] | {"memfit.gpt"}
    assert "import cycle: memfit.gpt -> memfit.meter -> memfit.gpt" in problems(graph), problems(graph)


def test_a_planted_cycle_of_three_fails():
    graph = graph_of_course()
    for a, b in (("memfit.gpt", "memfit.meter"), ("memfit.meter", "memfit.timing"), ("memfit.timing", "memfit.gpt")):
        graph[a] = graph[a] | {b}
    assert "import cycle: memfit.gpt -> memfit.meter -> memfit.timing -> memfit.gpt" in problems(graph), \
        problems(graph)


def test_a_planted_knot_names_every_module_in_it():
    graph = graph_of_course()  # two loops through memfit.gpt: a chain shows one, the other's module is named
    for a, b in (("memfit.gpt", "memfit.meter"), ("memfit.meter", "memfit.gpt"), ("memfit.gpt", "memfit.timing"),
                 ("memfit.timing", "memfit.plots"), ("memfit.plots", "memfit.gpt")):
        graph[a] = graph[a] | {b}
    assert [line for line in problems(graph) if "cycle" in line] == [
        "import cycle: memfit.gpt -> memfit.meter -> memfit.gpt "
        "(and memfit.plots, memfit.timing on other loops among the same modules)"]


def test_a_package_and_its_own_submodule_are_no_cycle():
    graph = graph_of_course()
    graph["memfit.hardware"] = graph["memfit.hardware"] | {"memfit"}  # memfit imports memfit.hardware already
    assert "memfit.hardware" in graph["memfit"] and not cycles(graph)


@pytest.mark.parametrize("source", [
    'DEFAULT = "memfit.from_lessons.zero:ZeroAdamW"',
    'def f(lesson):\n    return f"memfit.from_lessons.{lesson}"',
    'def main(optimizer="memfit.from_lessons.zero:ZeroAdamW"):\n    pass',
])
def test_a_planted_string_naming_lesson_code_fails(source):
    assert lesson_code_named("memfit.zero", source)
    assert not lesson_code_named("memfit.from_lessons.fine_tune", source)  # lesson code names lesson code
    assert not lesson_code_named("benchmarks.zero", source)  # above the library, naming it is the point
