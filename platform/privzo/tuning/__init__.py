"""Ray Tune searches under a fixed privacy budget, with the whole search's privacy accounted."""

from privzo.tuning.config import SearchConfig, load_search_config
from privzo.tuning.plan import SearchPlan, plan_search
from privzo.tuning.search import run_search

__all__ = ["SearchConfig", "SearchPlan", "load_search_config", "plan_search", "run_search"]
