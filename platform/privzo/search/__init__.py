"""Ray Tune searches under a fixed privacy budget, with the whole search's privacy accounted."""

from privzo.search.config import SearchConfig, load_search_config
from privzo.search.plan import SearchPlan, plan_search
from privzo.search.runner import run_search

__all__ = ["SearchConfig", "SearchPlan", "load_search_config", "plan_search", "run_search"]
