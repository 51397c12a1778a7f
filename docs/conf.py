"""Sphinx configuration: MyST Markdown pages, the furo theme, reference pages from the code.

Build (strict, as CI does): ``sphinx-build -W --keep-going -n -b html docs docs/_build/html``.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent / "platform"))  # the checkout's privzo, installed or not
sys.path.insert(0, str(DOCS))

from _reference import write_reference  # noqa: E402

from privzo import __version__  # noqa: E402

write_reference(DOCS / "reference")

project = "privzo"
author = "the privzo authors"
copyright = "the privzo authors, Apache-2.0"
release = __version__
version = __version__

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links resolve, and are checked
suppress_warnings: list[str] = []
# help texts and commands hold "--option" and quotes that must print as typed
smartquotes = False
# untagged blocks are program output and tables, not code
highlight_language = "none"

html_theme = "furo"
html_title = f"privzo {release}"
html_static_path: list[str] = []
html_theme_options = {"navigation_with_keys": True}
