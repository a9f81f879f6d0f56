"""The decks: every lesson has one, each builds from the lessons' code, and each opens offline in a real browser.

Building needs node and npm (reveal.js and KaTeX from the npm registry, once); the browser tests need Chromium and
Playwright. Without them the tests say so and skip, except under CI (CI=true), where .ci/run installs Chromium and
a missing browser is a failure.
"""
from __future__ import annotations

import os
import shutil
import types

import pytest

from course import ROOT
from slides import build as slides_build
from slides.deck import DeckError, parse

pytestmark = pytest.mark.xdist_group("slides")  # its module fixtures are built once, on one worker

DECKS = slides_build.deck_names()


def _need(what: str, present: bool, how: str) -> None:
    if present:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing under CI: {how}")
    pytest.skip(f"skipped: needs {what} ({how})")


def need_node() -> None:
    _need("node and npm", bool(shutil.which("node") and shutil.which("npm")), "apt-get install nodejs npm")


def need_browser() -> None:
    from slides.browser import chromium_path
    try:
        import playwright  # noqa: F401
        has_playwright = True
    except ImportError:
        has_playwright = False
    _need("Chromium", chromium_path() is not None, "apt-get install chromium, or set CHROMIUM")
    _need("Playwright", has_playwright, "make test-slides installs requirements-slides.txt into .venv")


def test_every_lesson_and_the_overview_have_a_deck():
    from course.lessons import lessons as course_lessons
    lessons = course_lessons()
    assert sorted(DECKS) == sorted(lessons + ["overview"]), \
        f"slides/decks/ should hold overview.md and one deck per lesson: {lessons}"
    for deck in DECKS:
        assert (ROOT / "slides" / "figures" / f"{deck}.py").exists(), f"slides/figures/{deck}.py is missing"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every deck, HTML and PDF, built once into a temporary folder."""
    need_node()
    need_browser()
    out = tmp_path_factory.mktemp("slides")
    return out, slides_build.build(DECKS, out)


@pytest.mark.parametrize("deck", DECKS)
def test_deck_renders_offline(built, deck):
    from slides.browser import inspect_deck, pdf_pages
    out, summary = built
    report = inspect_deck(out / f"{deck}.html")
    assert not report.problems, f"{deck}: " + "; ".join(report.problems)
    assert 10 <= report.slides <= 25, f"{deck} has {report.slides} slides; a lesson's story takes 10-25"
    assert report.slides == summary[deck]["slides"]
    assert pdf_pages(out / f"{deck}.pdf") == report.slides, f"{deck}.pdf should have one page per slide"


def test_built_html_names_no_network(built):
    out, _ = built
    for deck in DECKS:
        text = (out / f"{deck}.html").read_text()
        assert "http://" not in text and "https://" not in text, f"{deck}.html refers to the network"
    for css in (out / "vendor").rglob("*.css"):
        assert "url(http" not in css.read_text().replace(" ", ""), f"{css.name} loads something from the network"


# ---- the build refuses a deck with a hole in it ----------------------------------------------------------------

def test_missing_name_or_failing_expression_names_deck_slide_and_expression():
    text = "---\ntitle: t\n---\n# one\n---\n## two\n{{ nowhere }}\n"
    with pytest.raises(DeckError, match=r"demo, slide 2: \{\{ nowhere \}\} failed.*name 'nowhere' is not defined"):
        parse("demo", text, {"known": "1"})
    with pytest.raises(DeckError, match=r"demo, slide 2: \{\{ known\['x'\] \| \.1f \}\} failed.*KeyError"):
        parse("demo", text.replace("nowhere", "known['x'] | .1f"), {"known": {}})


def test_expressions_are_evaluated_and_formatted_in_the_namespace():
    text = "---\ntitle: t\n---\n# {{ n | , }} bytes, {{ share | .0% }}, {{ gib(n) }}, {{ n * 2 }}\n"
    deck = parse("demo", text, {"n": 2**30, "share": 0.254, "gib": lambda b: f"{b / 2**30:.1f} GiB"})
    assert deck.slides[0].body == "# 1,073,741,824 bytes, 25%, 1.0 GiB, 2147483648"


def test_front_matter_and_empty_slides_are_errors():
    with pytest.raises(DeckError, match="front matter"):
        parse("demo", "# no front matter\n", {})
    with pytest.raises(DeckError, match="no title"):
        parse("demo", "---\nsubtitle: x\n---\n# a\n", {})
    with pytest.raises(DeckError, match="slide 2: the slide is empty"):
        parse("demo", "---\ntitle: t\n---\n# a\n---\n\n---\n# c\n", {})


def test_missing_figure_and_bad_math_are_errors(tmp_path):
    need_node()
    module = types.SimpleNamespace()
    with pytest.raises(DeckError, match=r"demo, slide 1: fig:chart has no fig_chart\(\)"):
        slides_build.build_html("demo", tmp_path, source="---\ntitle: t\n---\n# a\n![c](fig:chart)\n", module=module)
    slides_build.ensure_node_modules()
    with pytest.raises(DeckError, match=r"KaTeX cannot render: \$\\frac\{1\}\$"):
        slides_build.build_html("demo", tmp_path, source="---\ntitle: t\n---\n# a\n$\\frac{1}$\n", module=module)


def test_expressions_math_columns_and_notes_render(tmp_path):
    need_node()
    import matplotlib.pyplot as plt

    def fig_line():
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        return fig
    module = types.SimpleNamespace(n=1024, table="| a | b |\n| --- | --- |\n| 1 | 2 |", fig_line=fig_line)
    source = ("---\ntitle: t\n---\n# a\n---\n## cols\n{{ n | , }} bytes, $x_i^2$ and $5 and $6\n||\n"
              "![a line](fig:line)\n{{ table }}\nNote:\nsay $\\alpha$\n")
    slides_build.build_html("demo", tmp_path, source=source, module=module)
    html = (tmp_path / "demo.html").read_text()
    assert "1,024 bytes" in html and 'class="katex"' in html and "$5 and $6" in html  # prices are not math
    assert '<div class="columns">' in html and 'src="assets/demo/line.svg"' in html and "<table>" in html
    assert '<aside class="notes"><p>say <span class="katex">' in html
    assert (tmp_path / "assets" / "demo" / "line.svg").exists()


# ---- the browser inspection catches what breaks in a lecture hall ----------------------------------------------

BROKEN = """---
title: broken on purpose
---
# a good first slide
with text
---
## a picture from the network
<img src="https://example.com/logo.png">
---
## a missing picture
<img src="assets/nowhere.png">
---
&nbsp;
---
## far too long
{long}
---
## a script that fails
<script>callSomethingThatDoesNotExist()</script>
text
"""


def test_inspection_catches_each_kind_of_broken_slide(tmp_path):
    need_node()
    need_browser()
    from slides.browser import inspect_deck
    slides_build.ensure_node_modules()
    slides_build.copy_vendor(tmp_path)
    source = BROKEN.replace("{long}", "\n".join(f"- line {i}" for i in range(40)))
    slides_build.build_html("broken", tmp_path, source=source, module=types.SimpleNamespace())
    problems = inspect_deck(tmp_path / "broken.html").problems
    text = "\n".join(problems)
    expected = {"the HTML refers to the network: https://example.com/logo.png": "an http reference",
                "request left the machine: https://example.com/logo.png": "a request to the network",
                "image missing or broken: assets/nowhere.png": "a missing image",
                "slide 4 is blank": "a blank slide",
                "slide 5 overflows": "an overflowing slide",
                "callSomethingThatDoesNotExist": "a JavaScript error"}
    for needle, what in expected.items():
        assert needle in text, f"the inspection missed {what}; it reported:\n{text}"
    assert not any(p.startswith("slide 1 ") for p in problems), f"the good slide was flagged:\n{text}"
