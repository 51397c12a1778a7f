"""Run configuration: one typed section per concern, each beside the code it configures, composed
into ``RunConfig`` (``privzo.config.run``) and read from YAML with ``key.sub=value`` overrides
(``privzo.config.loading``). Configs are validated at load, so a bad value fails with a message
that names the field, the value and what is allowed, before any model is built or anything is
recorded.

This package re-exports the sections and the loader under one name for callers outside privzo.
"""

from privzo.algorithms.config import (
    ALGORITHMS,
    FIRST_ORDER_PHYSICAL_BATCH_SIZE,
    MAX_STEPS,
    AlgorithmName,
    FirstOrderConfig,
    OptimizerConfig,
)
from privzo.config.loading import (
    apply_overrides,
    build_config,
    dotted_items,
    dump_config,
    format_validation_error,
    load_config,
    read_yaml,
    validate_section,
    with_values,
)
from privzo.config.run import RunConfig
from privzo.config.tasks import DATA_SOURCES, TaskConfig, template_fields
from privzo.layouts.config import LayoutName, ParallelConfig
from privzo.models.config import ModelConfig, PeftConfig
from privzo.privacy.config import (
    DEFAULT_NOISE_GRID,
    LMO_MIN_GAMMA_SHAPE,
    MAX_CLIP,
    LmoConfig,
    MechanismName,
    PrivacyConfig,
)
from privzo.section import ConfigError, Section
from privzo.tracking.config import TrackingConfig

__all__ = [
    "ALGORITHMS",
    "DATA_SOURCES",
    "DEFAULT_NOISE_GRID",
    "FIRST_ORDER_PHYSICAL_BATCH_SIZE",
    "LMO_MIN_GAMMA_SHAPE",
    "MAX_CLIP",
    "MAX_STEPS",
    "AlgorithmName",
    "ConfigError",
    "FirstOrderConfig",
    "LayoutName",
    "LmoConfig",
    "MechanismName",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelConfig",
    "PeftConfig",
    "PrivacyConfig",
    "RunConfig",
    "Section",
    "TaskConfig",
    "TrackingConfig",
    "apply_overrides",
    "build_config",
    "dotted_items",
    "dump_config",
    "format_validation_error",
    "load_config",
    "read_yaml",
    "template_fields",
    "validate_section",
    "with_values",
]
