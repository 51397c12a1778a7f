"""Scaling tables, plots and reports built from MLflow runs (Arrow tables, Parquet files)."""

from privzo.analysis.report import build_report
from privzo.analysis.runs import load_runs
from privzo.analysis.tables import privacy_gap_table, resources_table, scaling_table

__all__ = ["build_report", "load_runs", "privacy_gap_table", "resources_table", "scaling_table"]
