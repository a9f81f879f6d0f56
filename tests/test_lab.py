"""make lab: JupyterLab as learners get it (no nbgrader tools), started as root too, with the user's options."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course import ROOT

LEARNER = ROOT / "tools" / "lab_learner"


def test_learners_lab_turns_off_every_nbgrader_extension_the_environment_installs():
    installed = Path(sys.prefix) / "etc" / "jupyter" / "jupyter_server_config.d" / "nbgrader.json"
    if not installed.exists():
        pytest.skip("skipped: nbgrader is not installed in this environment")
    turned_on = {k for k, on in json.loads(installed.read_text())["ServerApp"]["jpserver_extensions"].items() if on}
    ours = json.loads((LEARNER / "jupyter_server_config.json").read_text())["ServerApp"]["jpserver_extensions"]
    assert turned_on and all(ours.get(name) is False for name in turned_on), (turned_on, ours)
    lab = Path(sys.prefix) / "share" / "jupyter" / "labextensions"
    nbgrader_ui = {json.loads(p.read_text())["name"] for p in lab.glob("**/package.json")
                   if "nbgrader" in json.loads(p.read_text()).get("name", "")}
    disabled = json.loads((LEARNER / "labconfig" / "page_config.json").read_text())["disabledExtensions"]
    assert nbgrader_ui and all(disabled.get(name) for name in nbgrader_ui), (nbgrader_ui, disabled)


def test_make_lab_uses_the_learners_config_allows_root_and_takes_options():
    out = subprocess.run(["make", "-n", "lab", f"PYTHON={sys.executable}", "LAB_OPTS=--port=8890 --no-browser"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert f'JUPYTER_CONFIG_DIR="{LEARNER}"' in out and "jupyter lab lessons/" in out
    assert "--port=8890 --no-browser" in out
    assert ("--allow-root" in out) == (os.geteuid() == 0), out
    instructor = subprocess.run(["make", "-n", "lab-instructor", f"PYTHON={sys.executable}"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout
    assert "JUPYTER_CONFIG_DIR" not in instructor and "jupyter lab" in instructor
