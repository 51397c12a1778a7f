"""Reading configs: YAML files merged in order, ``key.sub=value`` overrides, validation errors
that name the field, and a config written back as YAML.

The search, study and synthetic-study configs read their files and sections through the same
functions, so every config file fails the same way.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError, field_validator

from privzo.config.run import RunConfig
from privzo.config.tasks import DATA_SOURCES, given_data_sources, replace_data_source
from privzo.section import ConfigError, Section

__all__ = [
    "apply_overrides",
    "build_config",
    "dotted_items",
    "dump_config",
    "format_validation_error",
    "load_config",
    "read_yaml",
    "validate_section",
    "with_values",
]


def _parse_scalar(text: str) -> Any:
    """Parse an override value the way YAML would ('1e-3' → float, 'null' → None).

    Text YAML cannot parse (such as ``{sentence} It was``) stays a plain string.
    """
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else value
        except ValueError:
            return value
    return value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides to a nested dict (a copy)."""
    result = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        dotted, raw = item.split("=", 1)
        if not raw.strip():  # YAML reads nothing as null: say so rather than set it silently
            raise ConfigError(
                f"override {item!r} has no value after '='; write one, or {dotted.strip()}=null "
                "to unset it"
            )
        node, key = _override_target(result, dotted.strip().split("."), item)
        node[key] = _parse_scalar(raw)
    return result


def _override_target(
    node: dict[str, Any], keys: list[str], item: str
) -> tuple[dict[str, Any], str]:
    """The mapping and key an override sets: sections by name, except where a mapping already
    holds the rest of the path as one dotted key (a search's ``space`` or ``overrides``), which
    ``space.optimizer.steps=[20]`` then replaces."""
    for index, key in enumerate(keys[:-1]):
        rest = ".".join(keys[index:])
        if rest in node:
            return node, rest
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {key!r} is not a section")
        node = child
    return node, keys[-1]


def format_validation_error(
    error: ValidationError, source: str, names: Mapping[str, str] | None = None
) -> str:
    """One line per fault, naming the field (as ``names`` calls it where given: a command's
    option rather than the section's key), the fault and what was given."""
    lines = [f"invalid config ({source}):"]
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"])
        field = (names or {}).get(field, field)
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        if not field:  # a check across sections: its message names the keys itself
            lines.append(f"  {message}")
            continue
        lines.append(f"  {field}: {message}{_shown(item.get('input'), item['type'])}")
    return "\n".join(lines)


def _shown(value: Any, error_type: str) -> str:
    """What was given, for the error line; a section's whole mapping is left out (its keys
    have lines of their own), but a mapping where text belongs is shown: an unquoted
    ``{text}`` in YAML (or an override) is a mapping, not a template."""
    if not isinstance(value, dict):
        return f" (got {value!r})"
    if error_type != "string_type":
        return ""
    return (
        f" (got {value!r}: YAML reads an unquoted {{...}} as a mapping; quote the text, as in "
        "task.template='{sentence} It was')"
    )


def build_config(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, source)) from None
    return config


def load_config(
    path: str | Path | list[str | Path] | None = None, overrides: list[str] | None = None
) -> RunConfig:
    """Load YAML run config(s) (the defaults when ``path`` is None) and apply overrides.

    Several files merge in order, later ones winning key by key, so a model file
    (configs/models/) and a task file (configs/tasks/) combine with a run file.
    A data source (``task.train_path``, ``data_dir``, ``hf_dataset``, ``builtin_dataset``) named
    by a later file or by an override replaces the one named before it; one file, or one set of
    overrides, naming two is refused.
    """
    paths = [] if path is None else path if isinstance(path, list) else [path]
    data: dict[str, Any] = {}
    for item in paths:
        layer = read_yaml(Path(item))
        data = _merge(_with_source_of(data, layer, f"config file {str(item)!r}"), layer)
    overrides = overrides or []
    layer = apply_overrides({}, [item for item in overrides if _sets_data_source(item)])
    data = apply_overrides(_with_source_of(data, layer, "the overrides"), overrides)
    return build_config(data, " + ".join(str(item) for item in paths) or "defaults")


def _sets_data_source(override: str) -> bool:
    return "=" in override and override.split("=", 1)[0].strip() in {
        f"task.{key}" for key in DATA_SOURCES
    }


def _with_source_of(data: dict[str, Any], layer: dict[str, Any], where: str) -> dict[str, Any]:
    """``data`` ready for ``layer`` to merge over it: its data source dropped if ``layer`` names
    another one; a layer that names two is refused, naming both."""
    task = layer.get("task")
    task = task if isinstance(task, dict) else {}
    given = given_data_sources(task)
    if len(given) > 1:
        named = " and ".join(f"task.{key}={task[key]!r}" for key in given)
        raise ConfigError(f"{where}: {named} both give the training rows; keep one of them")
    if not given or not isinstance(data.get("task"), dict):
        return data
    return {**data, "task": replace_data_source(data["task"], given)}


YAML_SUFFIXES = (".yaml", ".yml")


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML config file's top-level mapping; every fault names the file (and line, key)."""
    text = _read_text(path)
    try:
        loaded = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as error:
        raise ConfigError(_yaml_error_message(path, text, error)) from None
    if loaded is None:  # else refused later as a run config without a task data source
        raise ConfigError(f"config file {str(path)!r} is empty: it sets no keys")
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping at the top level (section: keys), "
            f"not a {type(loaded).__name__}; is it a run config?"
        )
    return loaded


def _read_text(path: Path) -> str:
    if path.is_dir():
        raise ConfigError(f"config file {str(path)!r} is a directory; give a YAML file in it")
    if not path.exists():
        hint = "" if path.suffix in YAML_SUFFIXES else " (an override is written key=value)"
        raise ConfigError(f"config file {str(path)!r} does not exist{hint}")
    if not path.is_file():  # a FIFO or device: reading it could block forever
        raise ConfigError(
            f"config file {str(path)!r} is not a regular file (a pipe, socket or device); "
            "give a YAML file"
        )
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"config file {str(path)!r} is not UTF-8 text (byte {error.start}); is it YAML?"
        ) from None
    except OSError as error:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {error.strerror}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one,
    so a repeated ``steps:`` would silently win over the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges are allowed
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # unhashable: the base class reports it
                continue
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first given on line {first.line + 1}); a key may "
                    "appear once per section",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def _yaml_error_message(path: Path, text: str, error: yaml.YAMLError) -> str:
    """'file, line L, column C: problem' plus the line itself (which shows the key)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    if mark is None:
        return f"config file {str(path)!r} is not valid YAML: {problem}"
    lines = text.splitlines()
    shown = lines[mark.line].strip() if mark.line < len(lines) else ""
    where = f"config file {str(path)!r}, line {mark.line + 1}, column {mark.column + 1}"
    message = f"{where}: {problem}"
    if shown:
        message += f" (in {shown!r})"
    if mark.line < len(lines) and "\t" in lines[mark.line][: mark.column + 1]:
        message += "; YAML indents with spaces, not tabs"
    return message


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def dump_config(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


_SectionT = TypeVar("_SectionT", bound=BaseModel)


def validate_section(
    section: type[_SectionT], data: Any, source: str, names: Mapping[str, str] | None = None
) -> _SectionT:
    """``section.model_validate(data)``, with a validation error as a ConfigError that names
    the field (or its option in ``names``), the value and what is allowed."""
    try:
        return section.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, source, names)) from None


def dotted_items(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optimizer": {"steps": 40}}`` → ``{"optimizer.steps": 40}``: nested sections become
    dotted leaves, so setting them merges key by key (like merging YAML files) instead of
    replacing the whole section. Lists and other values are leaves."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(dotted_items(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def with_values(
    config: RunConfig, values: dict[str, Any], source: str = "<overrides>"
) -> RunConfig:
    """A copy of ``config`` with dotted keys set to (already typed) values, validated again;
    a nested mapping among them merges into its section key by key (``dotted_items``)."""
    data = config.model_dump(mode="json")
    flat = dotted_items(values)
    task_values = {
        key.removeprefix("task."): value for key, value in flat.items() if key.startswith("task.")
    }
    data = _with_source_of(data, {"task": task_values}, source)
    for key, value in flat.items():
        *sections, leaf = key.split(".")
        node = data
        for section in sections:
            child = node.get(section)
            if not isinstance(child, dict):
                raise ConfigError(f"{key}: {section!r} is not a config section")
            node = child
        node[leaf] = value
    return build_config(data, source)


class OverBase(Section):
    """A config that starts from run config files (``base``: one path or several) with
    ``overrides`` (searches and studies): the two fields are declared by each subclass, where
    they sit in its own order; their parsing is shared here."""

    @field_validator("base", mode="before", check_fields=False)
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("overrides", check_fields=False)
    @classmethod
    def _dotted(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        # `overrides.optimizer.steps=40` on the command line nests {optimizer: {steps: 40}};
        # as dotted keys it merges into the base's optimizer section instead of replacing it
        return dotted_items(overrides)
