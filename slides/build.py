"""make slides: every deck under slides/decks/ -> slides/build/<deck>.html and <deck>.pdf, offline.

For each deck: import slides/figures/<deck>.py (its companion: the names the deck's {{ expressions }} use, and its
figures, from the course's code and recorded results), substitute and render the Markdown, render the math with
KaTeX (node, at build time), write the HTML next to a local copy of reveal.js and KaTeX (build/vendor/), then print
it to PDF in headless Chromium, one page per slide.
"""
from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from slides.deck import Deck, DeckError, parse, to_html

HERE = Path(__file__).resolve().parent
DECKS = HERE / "decks"
NODE_MODULES = HERE / "node_modules"
# What the decks load, copied from the npm packages (slides/package.json pins them): reveal.js's core, its white
# theme (fonts inlined) and speaker-notes plugin; KaTeX's stylesheet and its fonts.
VENDOR_FILES = {"reveal.js/dist/reveal.js": "reveal/reveal.js", "reveal.js/dist/reveal.css": "reveal/reveal.css",
                "reveal.js/dist/reset.css": "reveal/reset.css", "reveal.js/dist/theme/white.css": "reveal/white.css",
                "reveal.js/dist/plugin/notes.js": "reveal/notes.js", "katex/dist/katex.min.css": "katex/katex.min.css",
                "katex/dist/fonts": "katex/fonts"}
WIDTH, HEIGHT = 1280, 720

TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="stylesheet" href="vendor/reveal/reset.css">
<link rel="stylesheet" href="vendor/reveal/reveal.css">
<link rel="stylesheet" href="vendor/reveal/white.css">
<link rel="stylesheet" href="vendor/katex/katex.min.css">
<link rel="stylesheet" href="vendor/course.css">
</head>
<body>
<div class="reveal"><div class="slides">
{sections}
</div></div>
<script src="vendor/reveal/reveal.js"></script>
<script src="vendor/reveal/notes.js"></script>
<script>
Reveal.initialize({{ hash: true, width: {width}, height: {height}, margin: 0.03, center: false, slideNumber: "c/t",
  transition: "none", pdfMaxPagesPerSlide: 1, pdfSeparateFragments: false, plugins: [RevealNotes] }});
</script>
</body>
</html>
"""


def deck_names() -> list[str]:
    return sorted(p.stem for p in DECKS.glob("*.md"))


def ensure_node_modules() -> None:
    """reveal.js and KaTeX from the npm registry, at the versions package-lock.json pins (npm ci, once)."""
    if all((NODE_MODULES / src.split("/")[0]).exists() for src in VENDOR_FILES):
        return
    if shutil.which("npm") is None:
        raise RuntimeError("npm is not installed: the decks need reveal.js and KaTeX from the npm registry "
                           "(Debian: apt-get install npm), once; after that the build is offline")
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=HERE, check=True)


def copy_vendor(out: Path) -> None:
    vendor = out / "vendor"
    for src, dst in VENDOR_FILES.items():
        target = vendor / dst
        target.parent.mkdir(parents=True, exist_ok=True)
        if (NODE_MODULES / src).is_dir():
            shutil.copytree(NODE_MODULES / src, target, dirs_exist_ok=True)
        else:
            shutil.copyfile(NODE_MODULES / src, target)
    shutil.copyfile(HERE / "course.css", vendor / "course.css")


def render_math(formulas: list[tuple[str, bool]]) -> list[str]:
    """KaTeX's HTML for each (tex, display), in one node process; a formula KaTeX rejects is a DeckError."""
    script = HERE / "katex_render.js"
    result = subprocess.run(["node", str(script), str(NODE_MODULES / "katex")], input=json.dumps(formulas),
                            capture_output=True, text=True, check=True)
    rendered = json.loads(result.stdout)
    bad = [f"${tex}$: {r['error']}" for (tex, _), r in zip(formulas, rendered) if "error" in r]
    if bad:
        raise DeckError("KaTeX cannot render: " + "; ".join(bad))
    return [r["html"] for r in rendered]


def load_figures(name: str):
    """slides/figures/<name>.py: the deck's companion, the namespace of its expressions and its fig_*() functions."""
    try:
        return importlib.import_module(f"slides.figures.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"slides.figures.{name}":
            raise DeckError(f"{name}: slides/figures/{name}.py is missing (every deck has one: the names its "
                            f"expressions use, its figures)") from e
        raise
    except (FileNotFoundError, KeyError, ValueError) as e:  # the companion computes on import: a missing record
        raise DeckError(f"{name}: slides/figures/{name}.py could not compute what the deck quotes: {e}") from e


def build_html(name: str, out: Path, source: str | None = None, module=None) -> Deck:
    """Write out/<name>.html and its figures under out/assets/<name>/; returns the parsed deck.
    source / module: a deck's text and figures module given directly (the tests' broken decks)."""
    module = module or load_figures(name)
    text = source if source is not None else (DECKS / f"{name}.md").read_text()
    deck = parse(name, text, vars(module))  # {{ expressions }} see the companion's names
    assets = out / "assets" / name
    assets.mkdir(parents=True, exist_ok=True)
    figure_src = {}
    import matplotlib.pyplot as plt
    for slide in deck.slides:
        for fig_name in slide.figures:
            if fig_name in figure_src:
                continue
            draw = getattr(module, f"fig_{fig_name}", None)
            if draw is None:
                raise DeckError(f"{name}, slide {slide.number}: fig:{fig_name} has no fig_{fig_name}() in "
                                f"slides/figures/{name}.py")
            fig = draw()
            fig.savefig(assets / f"{fig_name}.svg", bbox_inches="tight", metadata={"Date": None})
            plt.close(fig)
            figure_src[fig_name] = f"assets/{name}/{fig_name}.svg"
    sections = to_html(deck, figure_src, render_math, footer=deck.meta.get("footer", deck.meta["title"]))
    (out / f"{name}.html").write_text(TEMPLATE.format(title=deck.meta["title"], sections=sections,
                                                      width=WIDTH, height=HEIGHT))
    return deck


def build(names: list[str], out: Path, pdf: bool = True) -> dict[str, dict]:
    """Build the decks; returns name -> {"slides", "pages", "seconds"}."""
    ensure_node_modules()
    out.mkdir(parents=True, exist_ok=True)
    copy_vendor(out)
    summary = {}
    for name in names:
        start = time.perf_counter()
        deck = build_html(name, out)
        pages = None
        if pdf:
            from slides.browser import print_pdf
            pages = print_pdf(out / f"{name}.html", out / f"{name}.pdf")
            if pages != len(deck.slides):
                raise DeckError(f"{name}: {len(deck.slides)} slides but the PDF has {pages} pages (a slide too tall "
                                f"for one page?)")
        summary[name] = {"slides": len(deck.slides), "pages": pages, "seconds": round(time.perf_counter() - start, 1)}
        print(f"{name}: {len(deck.slides)} slides" + (f", {pages} PDF pages" if pdf else "")
              + f" ({summary[name]['seconds']} s) -> {out / name}.html", flush=True)
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m slides", description=__doc__.splitlines()[0])
    ap.add_argument("decks", nargs="*", help=f"decks to build (default: all of {', '.join(deck_names())})")
    ap.add_argument("--out", type=Path, default=HERE / "build")
    ap.add_argument("--no-pdf", action="store_true", help="HTML only (no Chromium needed)")
    ap.add_argument("--check", action="store_true", help="then open each deck offline in Chromium and report problems")
    ap.add_argument("--screenshots", type=Path, help="with --check: keep each slide's PNG in this folder")
    args = ap.parse_args(argv)
    unknown = [d for d in args.decks if d not in deck_names()]
    if unknown:
        ap.error(f"no deck {', '.join(unknown)} under slides/decks/ (there are: {', '.join(deck_names())})")
    try:
        build(args.decks or deck_names(), args.out, pdf=not args.no_pdf)
    except (DeckError, RuntimeError, FileNotFoundError) as e:
        print(f"make slides: {e}", file=sys.stderr)
        return 1
    if args.check:
        from slides.browser import inspect_deck
        bad = 0
        for name in args.decks or deck_names():
            report = inspect_deck(args.out / f"{name}.html", args.screenshots)
            bad += bool(report.problems)
            print(f"{name}: {report.slides} slides, " + ("ok" if not report.problems else
                                                         "problems:\n  " + "\n  ".join(report.problems)))
        return 1 if bad else 0
    return 0
