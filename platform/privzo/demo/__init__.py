"""``privzo demo``: the offline demo (its arms, search and study in ``runner``) and the configs
it ships as package data (``configs/``)."""

from __future__ import annotations

from privzo.demo.runner import (
    ARMS,
    CONFIG_DIR,
    DEMO_EXPERIMENTS,
    SEARCH_CONFIG,
    STUDY_CONFIG,
    DemoRow,
    format_table,
    run_demo,
)

__all__ = [
    "ARMS",
    "CONFIG_DIR",
    "DEMO_EXPERIMENTS",
    "SEARCH_CONFIG",
    "STUDY_CONFIG",
    "DemoRow",
    "format_table",
    "run_demo",
]
