"""A deck's Markdown source -> reveal.js <section>s.

A deck is slides/decks/<name>.md:

    ---                               front matter: title, subtitle (one `key: value` per line)
    title: Where the memory goes
    ---
    # First slide                     slides are separated by a line holding only `---`
    Text with {{ a_number }} and $x^2$.
    ![what the figure shows](fig:peak_chart)
    Note:
    Speaker notes, to the slide's end.

{{ expr }} is a Python expression evaluated in the namespace of slides/figures/<name>.py, the deck's companion
(its names, the helpers it imports), and replaced by its value before Markdown is read (so it may be a whole Markdown
table); {{ expr | spec }} formats the value with format(value, spec), e.g. {{ n8b | , }} or {{ share | .0% }}.
fig:NAME is the SVG the companion's fig_NAME() draws. A line holding only `||` splits a slide's body into two columns.
$...$ and $$...$$ are rendered by KaTeX at build time. Every expression that fails, missing figure or malformed math
is an error that names the deck and the slide: a deck never shows a hole.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

import mistune


class DeckError(ValueError):
    """A deck that cannot be built as written: the message names the deck, the slide and what is wrong."""


@dataclass
class Slide:
    number: int              # 1-based, as the slide counter shows it
    body: str                # Markdown, expressions substituted
    notes: str = ""
    figures: list[str] = field(default_factory=list)


@dataclass
class Deck:
    name: str
    meta: dict
    slides: list[Slide]


# {{ expr }} or {{ expr | format spec }}: the spec is what follows the last ` | ` (a format spec holds no `|`)
EXPRESSION = re.compile(r"\{\{\s*(.+?)(?:\s+\|\s*([^|{}]*?))?\s*\}\}", re.S)
FIGURE = re.compile(r"!\[([^\]]*)\]\(fig:([A-Za-z_][A-Za-z0-9_]*)\)")
# $$...$$ first (display), then $...$ (inline: no space after the opening or before the closing $, so "$5 and $6" is
# text)
MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$])\$(?=\S)(.+?)(?<=\S)(?<!\\)\$(?!\d)", re.S)
SEPARATOR = re.compile(r"^---[ \t]*$", re.M)
NOTES = re.compile(r"^Note:[ \t]*$", re.M)
COLUMN_BREAK = re.compile(r"^\|\|[ \t]*$", re.M)


def parse(name: str, text: str, namespace: dict) -> Deck:
    """Split the source into front matter and slides, and substitute each {{ expression }}'s value."""
    parts = SEPARATOR.split(text)
    if len(parts) < 3 or parts[0].strip():
        raise DeckError(f"{name}: a deck starts with front matter between two `---` lines (title: ...)")
    meta = {}
    for line in parts[1].strip().splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            raise DeckError(f"{name}: front matter line {line!r} is not `key: value`")
        meta[key.strip()] = value.strip()
    if "title" not in meta:
        raise DeckError(f"{name}: the front matter has no title")
    slides = []
    for number, source in enumerate(parts[2:], start=1):
        if not source.strip():
            raise DeckError(f"{name}, slide {number}: the slide is empty (two `---` in a row?)")
        body, notes = NOTES.split(source, maxsplit=1) if NOTES.search(source) else (source, "")
        body, notes = _substitute(name, number, body, namespace), _substitute(name, number, notes, namespace)
        slides.append(Slide(number, body.strip(), notes.strip(), [m.group(2) for m in FIGURE.finditer(body)]))
    return Deck(name, meta, slides)


def _substitute(deck: str, number: int, text: str, namespace: dict) -> str:
    def value(m: re.Match) -> str:
        expr, spec = m.group(1), m.group(2)
        try:
            result = eval(expr, dict(namespace))  # a copy: an expression cannot change what the next one sees
            return format(result, spec) if spec is not None else str(result)
        except Exception as e:
            raise DeckError(f"{deck}, slide {number}: {m.group(0)} failed in slides/figures/{deck}.py's namespace: "
                            f"{type(e).__name__}: {e}") from e
    return EXPRESSION.sub(value, text)


_markdown = mistune.create_markdown(escape=False, plugins=["table", "strikethrough"])


def to_html(deck: Deck, figure_src: dict[str, str], render_math, footer: str = "") -> str:
    """The deck's <section>s. figure_src: figure name -> the path the HTML loads it from;
    render_math(list of (tex, display)) -> list of HTML strings (KaTeX)."""
    pieces, formulas = [], []

    def protect(text: str) -> str:
        def token(m: re.Match) -> str:
            display = m.group(1) is not None
            formulas.append((m.group(1) if display else m.group(2), display))
            return f"MATHTOKEN{len(formulas) - 1}X"
        return MATH.sub(token, text)

    def figures(text: str) -> str:
        # Markdown's own image syntax, pointed at the built SVG (an <img> put in before Markdown would open an
        # HTML block that swallows the lines below it); the class is added after.
        return FIGURE.sub(lambda m: f"![{m.group(1)}]({figure_src[m.group(2)]})", text)

    def markdown(text: str) -> str:
        return _markdown(figures(protect(text))).replace('<img src="assets/', '<img class="figure" src="assets/')

    for slide in deck.slides:
        columns = COLUMN_BREAK.split(slide.body)
        if len(columns) > 1:
            # the heading (if the slide starts with one) stays above both columns
            head, _, first = columns[0].partition("\n") if columns[0].lstrip().startswith("#") else ("", "", columns[0])
            cells = "".join(f'<div class="column">{markdown(c)}</div>' for c in [first, *columns[1:]])
            body = markdown(head) + f'<div class="columns">{cells}</div>'
        else:
            body = markdown(slide.body)
        notes = f'<aside class="notes">{markdown(slide.notes)}</aside>' if slide.notes else ""
        foot = f'<div class="slide-footer">{html.escape(footer)}</div>' if footer else ""
        pieces.append(f'<section data-slide="{slide.number}">\n{body}{foot}{notes}</section>')
    rendered = render_math(formulas) if formulas else []
    out = "\n".join(pieces)
    return re.sub(r"MATHTOKEN(\d+)X", lambda m: rendered[int(m.group(1))], out)
