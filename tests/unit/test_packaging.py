"""What an installed privzo carries: the demo's configs ship as package data."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import privzo
from conftest import REPO
from privzo.config import load_config
from privzo.demo import ARMS, CONFIG_DIR, SEARCH_CONFIG, STUDY_CONFIG
from privzo.search.config import base_run_config, load_search_config
from privzo.studies.config import load_study_config

PACKAGE_DIR = Path(privzo.__file__).resolve().parent


def test_the_wheel_ships_the_demo_configs_and_they_load_from_it(tmp_path):
    source = tmp_path / "source"  # a copy: building writes build/ and egg-info beside the code
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info"))
    build = ["wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist")]
    subprocess.run([sys.executable, "-m", "pip", *build, str(source)], check=True)
    (wheel,) = (tmp_path / "dist").glob("privzo-*.whl")
    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)
    runs = installed / "privzo" / CONFIG_DIR.relative_to(PACKAGE_DIR)
    for name in ARMS.values():
        assert load_config(runs / name).optimizer.steps > 0, name
    search = load_search_config(runs / SEARCH_CONFIG)
    assert base_run_config(search).optimizer.algorithm == "dpzero"
    assert load_study_config(runs / STUDY_CONFIG)


def test_the_checkout_configs_are_the_packaged_ones():
    for relative in ("runs/tiny-dpzero.yaml", "searches/tiny.yaml", "studies/tiny-scaling.yaml"):
        linked = REPO / "configs" / relative
        assert linked.resolve() == (CONFIG_DIR.parent / relative).resolve(), relative
