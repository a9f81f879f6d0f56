"""grades/feedback/<student>/<lesson>.html: what each check found, for the learner."""
from __future__ import annotations

import html
from pathlib import Path

from autograder.gradebook import Row, points

COLORS = {"passed": "#1a7f37", "failed": "#cf222e", "error": "#cf222e", "timeout": "#bc4c00", "skipped": "#6e7781"}


def write_feedback(folder: Path, student: str, lesson: str, rows: list[Row], notes: list[str] = ()) -> Path:
    got, total, gpu = points(rows)  # as the terminal's summary counts them
    apart = (f" ({gpu:g} more need a GPU: skipped on this machine, in no total here)" if gpu else "")
    body = "\n".join(
        f"<tr><td>{html.escape(r.check)}</td><td style='color:{COLORS.get(r.status, '#000')}'>{r.status}</td>"
        f"<td>{r.points:g} / {r.max_points:g}</td><td>{html.escape(r.message)}</td></tr>" for r in rows)
    notes_html = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in notes)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(lesson)}: feedback for {html.escape(student)}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}td,th{{border-bottom:1px solid #ddd;padding:.4em;text-align:left;vertical-align:top}}table{{border-collapse:collapse}}.note{{color:#6e7781}}</style></head>
<body><h1>{html.escape(lesson)}</h1><p>{html.escape(student)}: <b>{got:g} / {total:g}</b> points{html.escape(apart)}</p>{notes_html}
<table><tr><th>check</th><th>status</th><th>points</th><th>message</th></tr>
{body}
</table></body></html>
"""
    out = folder / student / f"{lesson}.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out
