// Render [[tex, display], ...] (JSON on stdin) with KaTeX; print [{html} | {error}, ...]. Called by slides/build.py
// so the decks carry finished math and load no script to typeset it.
const katex = require(process.argv[2]);
let input = "";
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const out = JSON.parse(input).map(([tex, display]) => {
    try {
      // Inside HTML, <math> (KaTeX's copy for screen readers) and <svg> (its stretchy braces) need no xmlns:
      // drop the namespaces, so the deck names no URL at all.
      const html = katex.renderToString(tex, { displayMode: display, throwOnError: true });
      return { html: html.replace(/ xmlns="http:\/\/www\.w3\.org\/[^"]*"/g, "") };
    } catch (e) {
      return { error: String(e.message) };
    }
  });
  process.stdout.write(JSON.stringify(out));
});
