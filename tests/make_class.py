"""A synthetic class to grade: notebooks that mix reference, stub and known-wrong or known-right cells.

    python -m tests.make_class OUT_DIR --students 100 --seed 0 [--lessons 00_first_kernel,01_model_states] [--force]
    make grade SUBMISSIONS=OUT_DIR        # then compare grades/gradebook.csv with OUT_DIR/manifest.json

Writes OUT_DIR/<student>/<lesson>.ipynb for every student and lesson (default: all lessons) and
OUT_DIR/manifest.json, which says what each student got and what the grader should give them.

A student's notebook is the lesson as released (lessons/NN_topic.ipynb, read as JSON: nbgrader's cell
metadata and metadata.memfit.lesson kept as they are) with each exercise cell chosen, deterministically
from the seed, among:

- reference: the source of the solution's cell (solutions/NN_topic.ipynb, same nbgrader grade_id);
- stub: the released cell, `raise NotImplementedError()` and all;
- mutant: the cell's source replaced by imports of a registered wrong or right implementation
  (tests/mutants/registry.py), e.g. `from tests.mutants.first_kernel import bytes_of_counts_dims as bytes_of`.
  The grader's processes have the repository root on PYTHONPATH, so the import works in grading.

An exercise cell is a code cell that defines (`def`/`class` at top level, found with ast) a function that a
check is given (Check.uses). Most are nbgrader solution cells; a few hold given code that a check takes
(lesson 04's use_fused_kernels, lesson 05's flash_attention): those have no stub, only reference or mutant.
Each cell is a reference with probability 0.40, a stub with 0.25 and a mutant with 0.35 (renormalised
where a kind does not exist); a few students are all reference and a few all stub.

A mutant entry covering every check-used function of its cell replaces the whole cell: the other names the
cell defined (a Triton kernel, a helper) disappear, and later cells that use them may break, as a real
mistake would. An entry that keeps some of the cell's check-used functions as the reference ("ref") keeps
the cell's source and appends the imports. The manifest records, per mutant cell, what it removed, which
cells use the removed names and which checks it touched.

Expected outcome of each (student, lesson, check), in the manifest:
- "skipped on CPU" for a check that needs a GPU (with "expected_on_gpu" beside it);
- "keeps points" when the functions the check calls are the reference or a registered right alternative;
- "loses points" when one is the stub, or a registered wrong mutant, or given code the check calls
  reaches a stub;
- "unknown" otherwise, with the reason: a combination the registry does not prove (a mutant registered for
  another check of the same function, a mutant or stub reached through the learner's own code), or code
  that uses a name a whole-cell replacement removed.
"""
from __future__ import annotations

import argparse
import ast
import copy
import inspect
import json
import random
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from course import ROOT
from course.lessons import lessons, solution_path
from autograder.checks import Check, checks_for
from memfit.notebook import cell_source, is_demo_cell, is_test_cell, strip_magics
from tests.mutants.registry import REF, REGISTRY, as_mapping, mutant_module

WEIGHTS = {"reference": 0.40, "stub": 0.25, "mutant": 0.35}
KEEPS, LOSES, SKIPPED, UNKNOWN = "keeps points", "loses points", "skipped on CPU", "unknown"


def all_lessons() -> list[str]:
    return lessons()


def dumps(obj) -> str:
    """The course's JSON style (tools.make_lessons.dumps): stable, so the same seed gives the same bytes."""
    return json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def source_lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


# ------------------------------------------------------------------------------------------- parsing

@dataclass
class Binding:
    """A top-level name a cell binds: the names its statements load, and their code (to tell stubs apart)."""
    refs: set[str] = field(default_factory=set)
    code: str = ""
    defined: bool = False  # by a def or class statement (an exercise's function), not an import or assignment


def _bound(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [a.asname or a.name.split(".")[0] for a in node.names if a.name != "*"]
    targets = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    for block in ("body", "orelse", "finalbody", "handlers"):  # if / try / with / for at top level
        for child in getattr(node, block, []) or []:
            if isinstance(child, ast.stmt):
                names += _bound(child)
            elif isinstance(child, ast.ExceptHandler):
                names += [n for s in child.body for n in _bound(s)]
    return names


def parse_cell(source: str) -> dict[str, Binding]:
    """{name: Binding} for the names a cell binds at top level (magics ignored)."""
    try:
        tree = ast.parse(strip_magics(source))
    except SyntaxError:
        return {}
    out: dict[str, Binding] = {}
    for node in tree.body:
        # A name only used as a fallback (`predict = predict or predict_peak`) is not assumed to be called.
        fallbacks = {id(v) for n in ast.walk(node) if isinstance(n, ast.BoolOp) and isinstance(n.op, ast.Or)
                     for v in n.values[1:] if isinstance(v, ast.Name)}
        refs = {n.id for n in ast.walk(node)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in fallbacks}
        for name in _bound(node):
            b = out.setdefault(name, Binding())
            b.refs |= refs
            b.code += ast.unparse(node) + "\n"
            b.defined |= isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    return out


def called_functions(check: Check) -> tuple[str, ...]:
    """The names in check.uses that the check's function refers to in its body: a check may be given a
    function it never calls (it measures with the reference's instead)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(check.body)))
    fn = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    params = [a.arg for a in fn.args.args][:len(check.uses)]
    loaded = {n.id for stmt in fn.body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    return tuple(name for name, param in zip(check.uses, params) if param in loaded)


# --------------------------------------------------------------------------------------- one lesson

@dataclass
class Exercise:
    id: str  # the nbgrader grade_id of its cell, or given:<names> for a cell of given code
    index: int  # 0-based position of the cell in the notebook
    grade_id: str | None
    names: list[str]  # the check-used functions it defines, in check order
    checks: list[str]  # the checks that use them
    stubbed: list[str]  # names whose released (stub) code differs from the solution's
    candidates: list[dict[str, str]]  # {name: mutant} for the mutant choice, sorted


class Lesson:
    """A lesson's notebooks, checks, exercise cells and the registry's entries for them."""

    def __init__(self, lesson: str):
        self.name = lesson
        self.module = mutant_module(lesson)
        self.solution = json.loads(solution_path(lesson).read_text(encoding="utf-8"))
        self.release = json.loads((ROOT / "lessons" / f"{lesson}.ipynb").read_text(encoding="utf-8"))
        if len(self.solution["cells"]) != len(self.release["cells"]):
            raise SystemExit(f"lessons/{lesson}.ipynb and solutions/{lesson}.ipynb differ in cells: run make lessons")
        self.checks = checks_for(lesson)
        self.called = {c.name: called_functions(c) for c in self.checks}
        self.graded = [i for i, c in enumerate(self.solution["cells"])
                       if c.get("cell_type") == "code" and not is_test_cell(c) and not is_demo_cell(c)]
        self.bindings = {i: parse_cell(cell_source(self.solution["cells"][i])) for i in self.graded}
        self.released = {i: parse_cell(cell_source(self.release["cells"][i])) for i in self.graded}
        self.defined_in: dict[str, int] = {}  # name -> the last graded cell with its def or class
        for i in self.graded:
            for name, binding in self.bindings[i].items():
                if binding.defined:
                    self.defined_in[name] = i
        used = [n for c in self.checks for n in c.uses]
        self.exercises: dict[int, Exercise] = {}
        for name in dict.fromkeys(used):
            if name not in self.defined_in:
                raise SystemExit(f"solutions/{lesson}.ipynb has no def or class {name} (a check uses it)")
            index = self.defined_in[name]
            meta = (self.solution["cells"][index].get("metadata") or {}).get("nbgrader") or {}
            released_id = ((self.release["cells"][index].get("metadata") or {}).get("nbgrader") or {}).get("grade_id")
            if meta.get("grade_id") != released_id:
                raise SystemExit(f"{lesson}: cell {index + 1} has grade_id {meta.get('grade_id')!r} in the solution "
                                 f"and {released_id!r} in the release: run make lessons")
            ex = self.exercises.setdefault(index, Exercise("", index, meta.get("grade_id"), [], [], [], []))
            ex.names.append(name)
        for index, ex in self.exercises.items():
            ex.id = ex.grade_id or "given:" + ",".join(ex.names)
            ex.checks = [c.name for c in self.checks if set(c.uses) & set(ex.names)]
            if ex.grade_id:
                ex.stubbed = sorted(n for n, b in self.bindings[index].items()
                                    if n in self.released[index] and self.released[index][n].code != b.code)
            ex.candidates = self._candidates(ex)

    def _candidates(self, ex: Exercise) -> list[dict[str, str]]:
        seen = {}
        for check in self.checks:
            if check.name not in ex.checks:
                continue
            for verdict in ("wrong", "right"):
                for entry in REGISTRY[self.name][check.name][verdict]:
                    mutated = {n: m for n, m in as_mapping(entry, check.uses).items() if m != REF}
                    if mutated and set(mutated) <= set(ex.names):
                        seen[json.dumps(mutated, sort_keys=True)] = mutated
        return [seen[k] for k in sorted(seen)]

    def kinds(self, ex: Exercise) -> list[str]:
        return [k for k in WEIGHTS if (k != "stub" or ex.grade_id) and (k != "mutant" or ex.candidates)]


# ------------------------------------------------------------------------------ one student's notebook

@dataclass
class Choice:
    kind: str  # reference, stub, mutant
    mapping: dict[str, str] = field(default_factory=dict)  # mutant: {learner name: mutant name}
    whole: bool = False  # mutant: the whole cell replaced (else the imports appended)


def mutant_source(lesson: Lesson, mapping: dict[str, str]) -> str:
    return "".join(f"from {lesson.module} import {mutant} as {name}\n" for name, mutant in mapping.items())


class Notebook:
    """One student's notebook of one lesson: what each graded cell binds, and what the checks should say."""

    def __init__(self, lesson: Lesson, choices: dict[int, Choice]):
        self.lesson, self.choices = lesson, choices
        self.state: dict[int, dict[str, str]] = {}  # cell -> {name: ref | intact | stubbed | mutant:<name>}
        self.refs: dict[int, dict[str, set[str]]] = {}
        self.removed: dict[str, int] = {}  # name -> the exercise cell whose replacement removed it
        for i in lesson.graded:
            choice = choices.get(i, Choice("reference"))
            ex = lesson.exercises.get(i)
            if choice.kind == "stub":
                self.state[i] = {n: "stubbed" if n in ex.stubbed else "intact" for n in lesson.released[i]}
                self.refs[i] = {n: b.refs for n, b in lesson.released[i].items()}
                continue
            self.state[i] = {n: "ref" for n in lesson.bindings[i]}
            self.refs[i] = {n: b.refs for n, b in lesson.bindings[i].items()}
            if choice.kind == "mutant":
                if choice.whole:
                    for n in lesson.bindings[i]:
                        if n not in choice.mapping:
                            self.removed[n] = i
                    self.state[i], self.refs[i] = {}, {}
                for n, m in choice.mapping.items():
                    self.state[i][n] = "mutant:" + m
                    self.refs[i][n] = set()  # the mutant module is self-contained
        self.provider: dict[str, int] = {}
        for i in lesson.graded:
            for n in self.state[i]:
                self.provider[n] = i
        for n in list(self.removed):
            if n in self.provider:  # bound again by another cell
                del self.removed[n]

    def cell(self, i: int) -> dict:
        """The notebook cell at index i, from the release, with the chosen source."""
        cell = copy.deepcopy(self.lesson.release["cells"][i])
        choice = self.choices.get(i)
        if choice is None or choice.kind == "stub":
            return cell
        reference = cell_source(self.lesson.solution["cells"][i])
        if choice.kind == "reference":
            cell["source"] = source_lines(reference)
        elif choice.whole:
            cell["source"] = source_lines(mutant_source(self.lesson, choice.mapping))
        else:
            cell["source"] = source_lines(reference.rstrip("\n") + "\n\n" + mutant_source(self.lesson, choice.mapping))
        return cell

    def notebook(self) -> dict:
        nb = copy.deepcopy(self.lesson.release)
        nb["cells"] = [self.cell(i) for i in range(len(nb["cells"]))]
        return nb

    def exercise_of(self, i: int) -> str | None:
        ex = self.lesson.exercises.get(i)
        return ex.id if ex else None

    def impl(self, name: str) -> str:
        """ref, stub or the mutant standing for a learner function (removed: gone from the notebook)."""
        if name not in self.provider:
            return "removed"
        s = self.state[self.provider[name]][name]
        return "stub" if s == "stubbed" else s[len("mutant:"):] if s.startswith("mutant:") else REF

    def expect(self, check: Check, gpu: bool = False) -> tuple[str, str, list[str]]:
        """(expected outcome, why, the exercises involved) of one check on this notebook."""
        if check.needs_gpu and not gpu:
            return SKIPPED, "needs a GPU", []
        lesson = self.lesson
        uses = {n: self.impl(n) for n in check.uses}
        involved = {self.exercise_of(self.provider[n]) for n in check.uses if n in self.provider} - {None}
        gone = [n for n, v in uses.items() if v == "removed"]
        if gone:
            return LOSES, f"the notebook defines no {', '.join(gone)}", sorted(involved)
        called = lesson.called[check.name]
        stubs = [n for n in called if uses[n] == "stub"]
        if stubs:
            return LOSES, f"{', '.join(stubs)} is the stub", sorted(involved)
        # What the called functions reach through code kept in the notebook (a mutant's module is self-contained).
        broken, dep_stubs, dep_mutants = [], [], []
        frontier = [n for n in called if uses[n] == REF]
        seen = set(frontier)
        while frontier:
            name = frontier.pop()
            for ref in sorted(self.refs[self.provider[name]].get(name, ())):
                if ref in seen:
                    continue
                seen.add(ref)
                if ref in self.removed:
                    broken.append(ref)
                    involved.add(self.exercise_of(self.removed[ref]))
                    continue
                if ref not in self.provider:
                    continue  # a builtin, or a name bound inside a function
                i = self.provider[ref]
                state = self.state[i][ref]
                if state == "stubbed":
                    dep_stubs.append(ref)
                    involved.add(self.exercise_of(i))
                elif state.startswith("mutant:"):
                    dep_mutants.append(ref)
                    involved.add(self.exercise_of(i))
                else:
                    frontier.append(ref)
        involved.discard(None)
        involved = sorted(involved)
        if broken:
            cells = sorted({self.exercise_of(self.removed[n]) for n in broken})
            return LOSES, (f"calls {', '.join(sorted(set(broken)))}, removed when {', '.join(cells)} was replaced by "
                           "a mutant import (a NameError)"), involved
        if dep_stubs:
            return LOSES, f"calls the stub {', '.join(sorted(set(dep_stubs)))}", involved
        if dep_mutants:
            return UNKNOWN, (f"calls {', '.join(sorted(set(dep_mutants)))}, a mutant the registry proves for its own "
                             "checks only"), involved
        key = {n: uses[n] for n in called}
        if all(v == REF for v in key.values()):
            return KEEPS, "the reference", involved
        for verdict, outcome in (("wrong", LOSES), ("right", KEEPS)):
            for entry in REGISTRY[lesson.name][check.name][verdict]:
                mapping = as_mapping(entry, check.uses)
                if {n: mapping[n] for n in called} == key:
                    return outcome, f"a registered {verdict} implementation", involved
        mutants = sorted(v for v in key.values() if v != REF)
        return UNKNOWN, f"the registry does not prove what {', '.join(mutants)} does to this check", involved


# ------------------------------------------------------------------------------------------ the class

def choose(lesson: Lesson, rng: random.Random, profile: str) -> dict[int, Choice]:
    choices = {}
    for index in sorted(lesson.exercises):
        ex = lesson.exercises[index]
        kinds = lesson.kinds(ex)
        if profile == "all reference":
            kind = "reference"
        elif profile == "all stub":
            kind = "stub" if "stub" in kinds else "reference"
        else:
            total = sum(WEIGHTS[k] for k in kinds)
            r, kind = rng.random() * total, kinds[-1]
            for k in kinds:
                if r < WEIGHTS[k]:
                    kind = k
                    break
                r -= WEIGHTS[k]
        if kind == "mutant":
            mapping = rng.choice(ex.candidates)
            choices[index] = Choice("mutant", dict(mapping), whole=set(mapping) == set(ex.names))
        else:
            choices[index] = Choice(kind)
    return choices


def describe(nb: Notebook) -> dict:
    """The manifest's record of one notebook."""
    lesson = nb.lesson
    exercises = {}
    for index in sorted(lesson.exercises):
        ex, choice = lesson.exercises[index], nb.choices[index]
        record = {"cell": index + 1, "defines": ex.names, "kind": choice.kind}
        if choice.kind == "mutant":
            removed = sorted(n for n, i in nb.removed.items() if i == index)
            users = sorted({i + 1 for i in lesson.graded
                            for refs in nb.refs[i].values() if set(removed) & refs})
            verdicts = {}
            for check in lesson.checks:
                for verdict in ("wrong", "right"):
                    for entry in REGISTRY[lesson.name][check.name][verdict]:
                        mutated = {n: m for n, m in as_mapping(entry, check.uses).items() if m != REF}
                        if mutated == choice.mapping:
                            verdicts.setdefault(verdict, []).append(check.name)
            record.update(mutant=choice.mapping, module=lesson.module,
                          replacement="whole cell" if choice.whole else "imports appended to the reference",
                          removed=removed, cells_using_removed=users, registered=verdicts)
        exercises[ex.id] = record
    checks, points = {}, {KEEPS: 0.0, LOSES: 0.0, UNKNOWN: 0.0}
    for check in lesson.checks:
        outcome, why, involved = nb.expect(check)
        entry = {"uses": {n: "reference" if nb.impl(n) == REF else nb.impl(n) for n in check.uses},
                 "exercises": involved, "expected": outcome, "why": why, "points": check.points}
        if check.needs_gpu:
            entry["expected_on_gpu"], entry["why_on_gpu"], entry["exercises"] = nb.expect(check, gpu=True)
        else:
            points[outcome] += check.points
        checks[check.name] = entry
    for ex_id, record in exercises.items():
        record["touches"] = [name for name, c in checks.items() if ex_id in c["exercises"]]
    return {"exercises": exercises, "checks": checks,
            "cpu_points": {"expected": points[KEEPS], "unknown": points[UNKNOWN],
                           "max": sum(c.points for c in lesson.checks if not c.needs_gpu)}}


def make_class(out_dir: Path, students: int, seed: int, lessons: list[str]) -> dict:
    """Write the notebooks and manifest.json; returns the manifest."""
    loaded = [Lesson(name) for name in lessons]
    width = max(3, len(str(students - 1)))
    names = [f"student_{i:0{width}d}" for i in range(students)]
    special = max(1, students // 30) if students >= 3 else 0
    picked = random.Random(f"{seed}/special").sample(range(students), 2 * special)
    profiles = {names[i]: "all reference" for i in picked[:special]}
    profiles.update({names[i]: "all stub" for i in picked[special:]})
    manifest = {"seed": seed, "students": students, "lessons": lessons, "weights": WEIGHTS,
                "source": "lessons/ as released, exercise cells from solutions/ and tests/mutants/registry.py",
                "class": {}}
    cells = {k: 0 for k in WEIGHTS}
    outcomes: dict[str, int] = {}
    for student in names:
        profile = profiles.get(student, "mixed")
        record = {"profile": profile, "lessons": {}}
        folder = out_dir / student
        folder.mkdir(parents=True, exist_ok=True)
        for lesson in loaded:
            rng = random.Random(f"{seed}/{student}/{lesson.name}")
            nb = Notebook(lesson, choose(lesson, rng, profile))
            (folder / f"{lesson.name}.ipynb").write_text(dumps(nb.notebook()), encoding="utf-8")
            described = describe(nb)
            record["lessons"][lesson.name] = described
            for ex in described["exercises"].values():
                cells[ex["kind"]] += 1
            for c in described["checks"].values():
                outcomes[c["expected"]] = outcomes.get(c["expected"], 0) + 1
        manifest["class"][student] = record
    total = sum(cells.values()) or 1
    manifest["summary"] = {"cells": cells, "cell_fractions": {k: round(v / total, 3) for k, v in cells.items()},
                           "checks": dict(sorted(outcomes.items()))}
    (out_dir / "manifest.json").write_text(dumps(manifest), encoding="utf-8")
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.make_class", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--students", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lessons", default="", help="comma-separated lessons (default: all)")
    parser.add_argument("--force", action="store_true", help="write into OUT_DIR even if it is not empty")
    args = parser.parse_args(argv)
    if args.out_dir.exists() and any(args.out_dir.iterdir()) and not args.force:
        parser.error(f"{args.out_dir} is not empty: a student left from another run would be graded too "
                     "(choose a new folder, or --force)")
    known = all_lessons()
    lessons = [s.strip() for s in args.lessons.split(",") if s.strip()] or known
    unknown = [s for s in lessons if s not in known]
    if unknown:
        parser.error(f"no such lesson: {', '.join(unknown)} (known: {', '.join(known)})")
    if args.students < 1:
        parser.error("--students must be at least 1")
    manifest = make_class(args.out_dir, args.students, args.seed, lessons)
    s = manifest["summary"]
    print(f"{args.students} students x {len(lessons)} lessons in {args.out_dir}: cells {s['cell_fractions']}, "
          f"checks {s['checks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
