"""A learner's JupyterLab, photographed: python -m tools.lab_screenshot URL OUT.png

Opens URL (a running `make lab`, lesson 06 say) in headless Chromium, waits for the notebook to render, saves a
screenshot and prints the menu bar's entries and whether any of nbgrader's tools (Formgrader, Create Assignment,
Validate, Assignment List, Course List) appear on the page. Exit status 1 when one does. The browser: $CHROMIUM, else `chromium` on PATH.
"""
from __future__ import annotations

import os
import shutil
import sys

NBGRADER_TOOLS = ("Formgrader", "Create Assignment", "Validate", "Assignment List", "Course List", "Nbgrader")


def main(argv=None) -> int:
    url, out = (argv or sys.argv[1:])[:2]
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        chromium = shutil.which(os.environ.get("CHROMIUM", "chromium"))
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(url)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        page.wait_for_timeout(3000)  # let the kernel connect and the toolbar settle
        menus = page.locator(".lm-MenuBar-itemLabel").all_inner_texts()
        text = page.inner_text("body")
        page.screenshot(path=out)
        browser.close()
    found = [tool for tool in NBGRADER_TOOLS if tool in text or tool in menus]
    print(f"menu bar: {', '.join(menus)}")
    print(f"nbgrader's tools on the page: {', '.join(found) or 'none'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
