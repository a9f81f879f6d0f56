"""The instructor decks: Markdown sources under decks/, their companions (the names the decks' expressions use, the
figures) under figures/, built by `make slides` (python -m slides) into build/ as offline HTML (reveal.js, KaTeX)
and PDF (headless Chromium)."""
