"""Headless Chromium, offline: print a deck to PDF, and inspect a built deck the way a lecture hall would see it.

Chromium is Debian's (/usr/bin/chromium; or $CHROMIUM), driven by Playwright's Python package with the network
cut: every request that is not file: or data: is aborted and reported. inspect_deck() returns the problems it
finds (an empty list is a pass); the tests run it on every deck and on decks broken on purpose.
"""
from __future__ import annotations

import io
import os
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# Without the background-networking flags Chromium keeps trying to reach Google's hosts (component updates, sync).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions",
                 "--font-render-hinting=none"]
BLANK_FRACTION = 0.004   # a slide whose content changes fewer pixels than this (of 1280 x 720) is blank


def chromium_path() -> str | None:
    """Chromium's executable: $CHROMIUM, or the first of chromium / chromium-browser / google-chrome on PATH."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def require_browser() -> str:
    path = chromium_path()
    if path is None:
        raise RuntimeError("no Chromium found: install it (Debian/Ubuntu: apt-get install chromium) or set CHROMIUM "
                           "to its executable; make slides prints the PDFs and tests the decks with it")
    try:
        import playwright  # noqa: F401
    except ImportError as e:
        raise RuntimeError("Playwright's Python package is missing: make slides installs requirements-slides.txt "
                           "into .venv (or pip install -r requirements-slides.txt)") from e
    return path


@contextmanager
def offline_page(width: int = 1280, height: int = 720):
    """A fresh Chromium page with the network cut. Yields (page, outside) where `outside` collects every
    request that tried to leave the machine."""
    from playwright.sync_api import sync_playwright
    executable = require_browser()
    outside: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": width, "height": height}, offline=True)

            def route(r):
                if r.request.url.startswith(("file:", "data:", "blob:")):
                    r.continue_()
                else:
                    outside.append(r.request.url)
                    r.abort()
            context.route("**/*", route)
            yield context.new_page(), outside
        finally:
            browser.close()


def _open(page, html: Path, query: str = "") -> None:
    page.goto(html.resolve().as_uri() + query)
    page.wait_for_function("() => window.Reveal && Reveal.isReady()", timeout=30_000)
    page.evaluate("() => document.fonts.ready.then(() => true)")


def print_pdf(html: Path, pdf: Path) -> int:
    """reveal.js's print layout (?print-pdf), one page per slide; returns the number of pages written."""
    with offline_page() as (page, outside):
        _open(page, html, "?print-pdf")
        page.wait_for_function("() => document.querySelectorAll('.pdf-page').length > 0", timeout=30_000)
        page.pdf(path=str(pdf), prefer_css_page_size=True, print_background=True)
        if outside:
            raise RuntimeError(f"{html.name}: printing asked the network for {outside[:3]}")
    return pdf_pages(pdf)


def pdf_pages(pdf: Path) -> int:
    """Pages of a PDF Chromium wrote: its page-tree root's /Count (Skia writes the tree uncompressed)."""
    counts = [int(n) for n in re.findall(rb"/Type\s*/Pages\b[^>]*?/Count\s+(\d+)", pdf.read_bytes())]
    counts += [int(n) for n in re.findall(rb"/Count\s+(\d+)[^>]*?/Type\s*/Pages\b", pdf.read_bytes())]
    if not counts:
        raise ValueError(f"{pdf}: no page tree found: not a PDF Chromium wrote?")
    return max(counts)


@dataclass
class Report:
    deck: str
    slides: int = 0
    problems: list[str] = field(default_factory=list)


def _changed_fraction(a: bytes, b: bytes) -> float:
    """The fraction of pixels that differ between two PNG screenshots of the same size."""
    from PIL import Image, ImageChops
    first, second = (Image.open(io.BytesIO(x)).convert("RGB") for x in (a, b))
    diff = ImageChops.difference(first, second).convert("L").point(lambda v: 255 if v > 24 else 0)
    return diff.histogram()[255] / (first.width * first.height)


HIDE_CONTENT = "section.present > *:not(aside):not(.slide-footer) { visibility: hidden !important; }"


def inspect_deck(html: Path, screenshots: Path | None = None) -> Report:
    """Open a built deck from disk with the network cut and look at every slide. Problems reported:
    a http(s) reference in the HTML; a request that left the machine; a file that failed to load (script,
    style, image, font); a JavaScript error; a font that failed; an image that did not decode; a KaTeX error;
    a slide whose content overflows 1280 x 720; a blank slide (its screenshot barely differs from the same slide
    with its content hidden). screenshots: a folder to keep each slide's PNG in."""
    report = Report(html.stem)
    text = html.read_text()
    for m in re.finditer(r"https?://[^\s\"'<>)]+", text):
        report.problems.append(f"the HTML refers to the network: {m.group(0)}")
    with offline_page() as (page, outside):
        failed, errors = [], []
        page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        try:
            _open(page, html)
        except Exception as e:  # noqa: BLE001 - a deck that never becomes ready is the problem to report
            report.problems.append(f"reveal.js never became ready: {e.__class__.__name__}: {str(e)[:200]}")
            return report
        state = page.evaluate("""() => ({
            total: Reveal.getTotalSlides(),
            sections: document.querySelectorAll('.slides > section').length,
            size: [Reveal.getConfig().width, Reveal.getConfig().height],
            fonts: [...document.fonts].filter(f => f.status === 'error').map(f => f.family),
            images: [...document.images].filter(i => !i.complete || i.naturalWidth === 0)
                .map(i => i.getAttribute('src')),
            katex: [...document.querySelectorAll('.katex-error')].map(e => e.textContent),
        })""")
        report.slides = state["total"]
        width, height = state["size"]
        if state["sections"] != state["total"]:
            report.problems.append(f"{state['sections']} <section>s but reveal.js counts {state['total']} slides")
        report.problems += [f"font failed to load: {f}" for f in state["fonts"]]
        report.problems += [f"image missing or broken: {s}" for s in state["images"]]
        report.problems += [f"math failed to render: {t}" for t in state["katex"]]
        if screenshots:
            screenshots.mkdir(parents=True, exist_ok=True)
        hide = None
        for index in range(state["total"]):
            page.evaluate(f"() => Reveal.slide({index})")
            page.wait_for_timeout(30)
            size = page.evaluate("""() => { const s = Reveal.getCurrentSlide();
                return [s.scrollWidth, s.scrollHeight, s.dataset.slide || ''] }""")
            label = f"slide {index + 1}"
            if size[1] > height + 2 or size[0] > width + 2:
                report.problems.append(f"{label} overflows: its content is {size[0]} x {size[1]} px, "
                                       f"the slide {width} x {height}")
            shot = page.screenshot()
            if screenshots:
                (screenshots / f"{html.stem}-{index + 1:02d}.png").write_bytes(shot)
            hide = page.add_style_tag(content=HIDE_CONTENT)
            empty = page.screenshot()
            hide.evaluate("e => e.remove()")
            if _changed_fraction(shot, empty) < BLANK_FRACTION:
                report.problems.append(f"{label} is blank: its content changes "
                                       f"{100 * _changed_fraction(shot, empty):.2f}% of the pixels")
        report.problems += [f"request left the machine: {u}" for u in outside]
        report.problems += [f"failed to load: {f}" for f in failed]
        report.problems += [f"JavaScript error: {e}" for e in errors]
    return report
