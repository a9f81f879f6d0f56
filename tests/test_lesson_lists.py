"""No list of lessons is kept by hand: course.lessons finds them (solutions/NN_topic.ipynb), and everything that goes
over the lessons derives its list from course.lessons.lessons() (a lesson added or removed then needs no edit
elsewhere; a list kept by hand silently leaves the new one out, as one of the notebook tests once left out lesson 08).

The heuristic: a literal list, tuple or set in the course's code (tests, tools, slides, benchmarks, autograder,
course) whose own elements hold two or more distinct full lesson names ("03_zero", "04_kernel_fusion") is a hand-kept
list of lessons. A lesson named alone (a test of one lesson, a deck's companion) is not, nor a table of cases each
naming its lesson (a tuple per case, one name in each). A list that must stay (a subset chosen on purpose) goes into
EXEMPT with its reason; none is exempted otherwise."""
import ast
from pathlib import Path

import pytest

from course.lessons import lessons

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("tests", "tools", "slides", "benchmarks", "autograder", "course")

# (file relative to ROOT, the lesson names of the list, sorted): why it is kept by hand. Empty: none is.
EXEMPT: dict[tuple[str, tuple[str, ...]], str] = {}


def course_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py") if "node_modules" not in p.parts)


def lesson_lists(source: str, names: set[str]) -> list[tuple[int, tuple[str, ...]]]:
    """(line, sorted lesson names) of each literal list, tuple or set of `source` whose elements name two or more
    distinct lessons among `names`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            named = {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names}
            if len(named) >= 2:
                found.append((node.lineno, tuple(sorted(named))))
    return found


def hand_kept_lists() -> list[tuple[str, int, tuple[str, ...]]]:
    names = set(lessons())
    return [(str(path.relative_to(ROOT)), line, named) for path in course_files()
            for line, named in lesson_lists(path.read_text(), names)]


def test_no_list_of_lessons_is_kept_by_hand():
    found = [f"{path}, line {line}: a list of lessons kept by hand {list(named)}: derive it from "
             f"course.lessons.lessons(), or exempt it in EXEMPT with its reason"
             for path, line, named in hand_kept_lists() if (path, named) not in EXEMPT]
    assert not found, "\n".join(found)


def test_every_exemption_still_exempts_a_list():
    used = {(path, named) for path, _, named in hand_kept_lists()}
    stale = [key for key in EXEMPT if key not in used]
    assert not stale, f"exemptions that match no list any more (remove them): {stale}"


def test_it_looks_at_every_folder_of_the_course():
    assert all((ROOT / folder).is_dir() for folder in FOLDERS)
    assert any(p.name == "test_lesson_lists.py" for p in course_files())
    assert not any("node_modules" in p.parts for p in course_files())


@pytest.mark.parametrize("planted, flagged", [
    ("LESSONS = [{a!r}, {b!r}]", True),
    ("for lesson in ({a!r}, {b!r}, {a!r}):\n    pass", True),
    ("@pytest.mark.parametrize('lesson', {{{a!r}, {b!r}}})\ndef test(lesson): pass", True),
    ("def f():\n    return [{a!r}, 'not_a_lesson', {b!r}]", True),
    ("LESSON = {a!r}", False),  # one lesson, named alone
    ("PAIR = ({a!r}, {a!r})", False),  # one lesson, twice
    ("CASES = [({a!r}, 'check_x'), ({b!r}, 'check_y')]", False),  # a table of cases, each naming its own lesson
    ("X = ['{a}_copy', '{b}.ipynb']", False),  # not lesson names themselves
])
def test_a_planted_list_of_lessons_is_found(planted, flagged):
    a, b = lessons()[:2]
    source = planted.format(a=a, b=b)
    assert bool(lesson_lists(source, set(lessons()))) == flagged, source
