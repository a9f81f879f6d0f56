"""The instructor decks: Markdown sources under decks/, their facts and figures under figures/, built by
`make slides` (python -m slides) into build/ as offline HTML (reveal.js, KaTeX) and PDF (headless Chromium)."""
