"""Run configuration: typed sections, YAML loading, ``--set`` overrides, validation."""

from fedray.config.loader import (
    ConfigError,
    apply_overrides,
    load_config_sections,
    read_yaml,
    save_config,
    saved_config_path,
    set_key,
    validate_config,
)
from fedray.config.references import import_reference, is_reference
from fedray.config.schema import (
    AlgorithmConfig,
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    ModelConfig,
    OutputConfig,
    ResourcesConfig,
    RunConfig,
    SyntheticConfig,
    TrainConfig,
)

__all__ = [
    "AlgorithmConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "ModelConfig",
    "OutputConfig",
    "ResourcesConfig",
    "RunConfig",
    "SyntheticConfig",
    "TrainConfig",
    "apply_overrides",
    "import_reference",
    "is_reference",
    "load_config_sections",
    "read_yaml",
    "save_config",
    "saved_config_path",
    "set_key",
    "validate_config",
]
