"""Config loading, overrides and every validation error, and every shipped config file."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import pytest

from conftest import REPO, write_sentiment_jsonl
from privzo.config import (
    DATA_SOURCES,
    MAX_CLIP,
    MAX_STEPS,
    ConfigError,
    RunConfig,
    apply_overrides,
    build_config,
    dotted_items,
    dump_config,
    load_config,
    read_yaml,
    with_values,
)
from privzo.layouts.config import MAX_MEMORY_GB
from privzo.models.shapes import resolve_named_shape
from privzo.planner import plan
from privzo.search.config import SearchConfig, base_run_config, load_search_config
from privzo.search.tuner import tune_param_space
from privzo.studies import ScalingStudyConfig, load_study_config
from privzo.studies.cells import cell_config, directions_of, expand_cells

CONFIG_ROOT = REPO / "configs"
SEARCHES = sorted((CONFIG_ROOT / "searches").glob("*.yaml"))
STUDIES = sorted((CONFIG_ROOT / "studies").glob("*.yaml"))
CONFIGS = sorted(set(CONFIG_ROOT.rglob("*.yaml")) - set(SEARCHES) - set(STUDIES))  # runs


def test_defaults_are_valid():
    config = load_config()
    assert isinstance(config, RunConfig)
    assert config.optimizer.algorithm == "dpzero" and config.mechanism == "gaussian"


def test_overrides_are_typed_and_nested():
    config = load_config(
        None,
        [
            "optimizer.learning_rate=1e-3",
            "privacy.epsilon=4",
            "task.examples_per_class=null",
            "optimizer.algorithm=mezo",
            "tracking.backend=none",
        ],
    )
    assert config.optimizer.learning_rate == 1e-3
    assert config.privacy.epsilon == 4.0
    assert config.task.examples_per_class is None
    assert config.optimizer.algorithm == "mezo" and not config.optimizer.is_private


def test_yaml_round_trip(tmp_path):
    config = load_config(None, ["seed=5", "optimizer.steps=7"])
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(config))
    assert load_config(path) == config


@pytest.mark.parametrize(
    ("override", "field", "value_text"),
    [
        ("privacy.epsilon=0", "privacy.epsilon", "0"),
        ("privacy.epsilon=-1", "privacy.epsilon", "-1"),
        ("privacy.delta=1", "privacy.delta", "1"),
        ("privacy.delta=1.5", "privacy.delta", "1.5"),
        ("optimizer.steps=0", "optimizer.steps", "0"),
        ("privacy.clip=0", "privacy.clip", "0"),
        ("privacy.clip=-2", "privacy.clip", "-2"),
        ("optimizer.algorithm=adam", "optimizer.algorithm", "adam"),
        ("optimizer.direction=cauchy", "optimizer.direction", "cauchy"),
        ("privacy.accountant=moments", "privacy.accountant", "moments"),
        ("model.dtype=float64", "model.dtype", "float64"),
        ("optimizer.learning_rate=0", "optimizer.learning_rate", "0"),
        ("optimizer.batch_size=0", "optimizer.batch_size", "0"),
        ("privacy.noise_multiplier=-1", "privacy.noise_multiplier", "-1"),
    ],
)
def test_out_of_range_values_name_field_and_value(override, field, value_text):
    with pytest.raises(ConfigError) as error:
        load_config(None, [override])
    message = str(error.value)
    assert field in message and value_text in message


@pytest.mark.parametrize("override", ["optimizer.steps=true", "privacy.epsilon=true"])
def test_a_boolean_is_not_a_number(override, tmp_path):
    key, _ = override.split("=")
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: true/false is not a number"):
        load_config(None, [override])
    section, leaf = key.split(".")
    path = tmp_path / "run.yaml"
    path.write_text(f"{section}:\n  {leaf}: false\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: true/false is not a number"):
        load_config(path)


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match=r"privacy\.epsilonn: unknown key"):
        load_config(None, ["privacy.epsilonn=1"])
    with pytest.raises(ConfigError, match=r"optimiser: unknown key"):
        load_config(None, ["optimiser.steps=1"])


def test_inconsistent_private_settings_are_rejected():
    with pytest.raises(ConfigError, match="Poisson"):
        load_config(None, ["privacy.sampler=shuffle"])
    with pytest.raises(ConfigError, match="pure"):
        load_config(None, ["privacy.accountant=pure"])
    with pytest.raises(ConfigError, match="RDP"):
        load_config(None, ["optimizer.algorithm=dpzo-laplace", "privacy.accountant=rdp"])
    with pytest.raises(ConfigError, match="delta"):
        load_config(None, ["privacy.delta=0"])
    laplace = load_config(
        None, ["optimizer.algorithm=dpzo-laplace", "privacy.accountant=pure", "privacy.delta=0"]
    )
    assert laplace.mechanism == "laplace"
    assert load_config(None, ["optimizer.algorithm=mezo", "privacy.sampler=shuffle"])


def test_template_needs_the_sentence_slot():
    with pytest.raises(ConfigError, match=r"task\.template"):
        load_config(None, ["task.template=It was"])


def test_bad_override_syntax_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"key\.sub=value"):
        apply_overrides({}, ["optimizer.steps"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "list.yaml")


def test_non_finite_numbers_are_rejected():
    with pytest.raises(ConfigError, match=r"optimizer\.learning_rate: .*finite"):
        load_config(None, ["optimizer.learning_rate=.inf"])
    with pytest.raises(ConfigError, match=r"privacy\.delta: .*finite"):
        load_config(None, ["privacy.delta=.nan"])


def test_shipped_configs_exist():
    assert CONFIGS, "configs/ holds no YAML files"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_shipped_config_loads(path):
    assert isinstance(load_config(path), RunConfig)


RUNS = sorted((CONFIG_ROOT / "runs").glob("*.yaml"))


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.name)
def test_every_shipped_run_config_can_start(path, tmp_path):
    """Preflight passes (capabilities, layout, data, σ for (ε, δ), the planner's fit on the
    configured GPUs), so the run starts; nothing is written. A cluster config's data directory
    is the cluster's (``privzo data prepare``): it is stood in for by SST-2-shaped rows here."""
    from privzo.preflight import preflight

    config = load_config(path)
    if config.task.data_dir is not None:
        for split, count in (("train", 2000), ("test", 1000)):
            write_sentiment_jsonl(tmp_path / f"{split}.jsonl", count, seed=len(split))
        config = load_config(path, [f"task.data_dir={tmp_path}"])
    checked = preflight(config, output_dir=tmp_path / "run")
    if checked.privacy.private:
        assert checked.privacy.epsilon <= config.privacy.epsilon * (1 + 1e-6)
    if config.parallel.use_gpu:  # the cluster configs: the planner says they fit
        assert checked.memory is not None and checked.memory.fits
        assert checked.memory.strategy in (config.parallel.strategy, "replica")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_every_shipped_study_config_loads(path, tmp_path):
    study = load_study_config(path)
    if not isinstance(study, ScalingStudyConfig):
        return
    cells = expand_cells(study)
    # a zeroth-order arm trains once per entry of the study's directions (K), the others once
    arms = [*study.private_algorithms, *study.non_private_algorithms]
    k = {algorithm: len(directions_of(study, algorithm)) for algorithm in arms}
    assert len(cells) == len(study.models) * len(study.tasks) * len(study.seeds) * (
        sum(k[a] for a in study.private_algorithms) * len(study.epsilons)
        + sum(k[a] for a in study.non_private_algorithms)
    )
    for cell in cells:  # every cell's run config is valid, fits its GPU, and so is its search
        config = cell_config(study, cell)
        assert_fits_one_gpu(config)
        if study.search is not None and cell.epsilon is not None:
            assert_search_points_valid(cell_search(study.search, config, tmp_path))


@pytest.mark.parametrize("path", SEARCHES, ids=lambda p: p.name)
def test_every_shipped_search_config_loads_with_its_base(path):
    search = load_search_config(path)
    assert isinstance(base_run_config(search), RunConfig)
    assert_search_points_valid(search)
    if search.resources.gpus_per_trial >= 1:
        assert_fits_one_gpu(base_run_config(search))


def cell_search(search_path: str, config: RunConfig, tmp_path: Path) -> SearchConfig:
    """The search a study runs for a private cell: its base replaced by the cell's run."""
    base_file = tmp_path / "base.yaml"
    base_file.write_text(dump_config(config))
    data = load_search_config(search_path).model_dump(mode="json")
    data.update(base=[str(base_file)], overrides={})
    return SearchConfig.model_validate(data)


def assert_search_points_valid(search: SearchConfig) -> None:
    """Every grid point (a range: its ends) makes a valid run, the trial count is known and
    the selection split exists: what plan_search checks before reading data or tokenizers."""
    lists = {
        key: spec if isinstance(spec, list) else [spec.low, spec.high]
        for key, spec in search.space.items()
    }
    for values in itertools.product(*lists.values()):
        config = base_run_config(search, dict(zip(lists, values, strict=True)))
        if search.selection.split == "validation":
            assert config.task.validation_size, "selection on a validation split needs one"
        if config.optimizer.is_private:  # a search's end-to-end bound is an RDP bound
            assert config.mechanism == "gaussian" and config.parallel.strategy == "single"
    if search.algorithm == "grid":
        assert search.trials.count in (None, search.grid_size())
    assert set(tune_param_space(search)) == set(search.space)


def assert_fits_one_gpu(config: RunConfig) -> None:
    """The memory planner's verdict for a named shape's model meant for a GPU (device auto or
    cuda)."""
    named = resolve_named_shape(config.model.name_or_path)
    if named is None or config.model.device == "cpu" or config.parallel.strategy != "single":
        return
    verdict = plan(
        named[1],
        gpus=1,
        gpu_memory_gb=config.parallel.gpu_memory_gb,
        dtype=config.model.dtype,
        batch_size=config.optimizer.physical_batch_size or config.optimizer.batch_size,
    )
    assert verdict.fits and verdict.strategy == "replica", verdict


def test_config_files_merge_in_order(tmp_path):
    run_file = tmp_path / "run.yaml"
    run_file.write_text("model: {name_or_path: tiny-opt, dtype: float32}\noptimizer: {steps: 7}\n")
    model_file = tmp_path / "model.yaml"
    model_file.write_text("model: {name_or_path: facebook/opt-1.3b}\n")
    config = load_config([run_file, model_file], ["optimizer.steps=9"])
    assert config.model.name_or_path == "facebook/opt-1.3b"
    assert config.model.dtype == "float32" and config.optimizer.steps == 9
    root = REPO / "configs"
    combined = load_config([root / "models" / "opt-125m.yaml", root / "tasks" / "sst2-opt.yaml"])
    assert combined.model.name_or_path == "facebook/opt-125m"
    assert combined.task.name == "sst2" and combined.task.train_size == 1000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "optimizer:\n  steps: 10\n  batch_size: 4\n  steps: 20\n",
            r"line 4, column 3: duplicate key 'steps' \(first given on line 2\)",
        ),
        ("seed: 1\nseed: 2\n", r"line 2, column 1: duplicate key 'seed'"),
        (
            "optimizer:\n\tsteps: 10\n",
            r"line 2, column 1: found character .* \(in 'steps: 10'\); YAML indents with spaces",
        ),
        (
            "optimizer:\n  steps: 10\n    batch_size: 4\n",
            r"line 3, column 15: mapping values are not allowed here \(in 'batch_size: 4'\)",
        ),
    ],
)
def test_yaml_faults_name_the_file_line_and_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"config file '{path}', {message}"):
        load_config(path)


def test_yaml_anchors_and_merges_still_load(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("base: &b {steps: 7, batch_size: 4}\noptimizer:\n  <<: *b\n  steps: 9\n")
    data = read_yaml(path)
    assert data["optimizer"] == {"steps": 9, "batch_size": 4}


def test_config_paths_that_are_not_yaml_files_are_named(tmp_path):
    with pytest.raises(ConfigError, match=rf"config file '{tmp_path}' is a directory"):
        load_config(tmp_path)
    (tmp_path / "binary.yaml").write_bytes(b"seed: 1\n\xff\xfe\n")
    with pytest.raises(ConfigError, match=r"binary\.yaml' is not UTF-8 text \(byte 8\)"):
        load_config(tmp_path / "binary.yaml")


@pytest.mark.parametrize(
    ("override", "allowed"),
    [
        ("optimizer.learning_rate=1e30", "less than or equal to 10"),
        ("optimizer.learning_rate=10.5", "less than or equal to 10"),
        ("optimizer.perturbation_scale=1e30", "less than or equal to 1"),
        ("optimizer.perturbation_scale=1e-300", "greater than or equal to 0.00000001"),
    ],
)
def test_step_size_and_perturbation_scale_have_a_stated_range(override, allowed):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: .*{re.escape(allowed)}"):
        load_config(None, [override])
    assert load_config(None, [f"{key}=1e-2"]).optimizer.model_dump()[key.split(".")[1]] == 1e-2


@pytest.mark.parametrize("text", ["", "# the run, to be written\n\n"], ids=["empty", "comments"])
def test_an_empty_config_file_is_named_as_empty(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value) == (f"config file '{path}' is empty: it sets no keys")


def test_a_config_that_is_not_a_regular_file_is_refused_before_reading(tmp_path):
    fifo = tmp_path / "run.yaml"
    os.mkfifo(fifo)  # opening it for reading would block until a writer comes
    with pytest.raises(ConfigError, match=r"run\.yaml' is not a regular file"):
        load_config(fifo)


@pytest.mark.parametrize("key", ["parallel.gpu_memory_gb", "parallel.host_memory_gb"])
def test_a_memory_no_machine_has_is_refused(key):
    assert load_config(None, [f"{key}={MAX_MEMORY_GB}"]).parallel.model_dump()[key[9:]] == (
        MAX_MEMORY_GB
    )
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: .*less than or equal to 1000000"):
        load_config(None, [f"{key}=1e30"])


def test_clip_and_steps_are_bounded_with_the_allowed_range():
    assert load_config(None, [f"privacy.clip={MAX_CLIP}"]).privacy.clip == MAX_CLIP
    assert load_config(None, [f"optimizer.steps={MAX_STEPS}"]).optimizer.steps == MAX_STEPS
    for clip in ("1.000001e6", "1e30", "1e308"):
        with pytest.raises(ConfigError, match=r"privacy\.clip: .*allowed: 0 < clip ≤ 1e6"):
            load_config(None, [f"privacy.clip={clip}"])
    with pytest.raises(ConfigError, match=r"privacy\.clip: .*finite"):
        load_config(None, ["privacy.clip=.inf"])
    with pytest.raises(ConfigError, match=r"optimizer\.steps: .*allowed: 1 ≤ steps ≤ 10_000_000"):
        load_config(None, [f"optimizer.steps={MAX_STEPS + 1}"])


def test_nested_values_merge_into_their_section_key_by_key():
    assert dotted_items({"optimizer": {"steps": 40, "first_order": {"weight_decay": 0.1}}}) == {
        "optimizer.steps": 40,
        "optimizer.first_order.weight_decay": 0.1,
    }
    base = load_config(None, ["optimizer.batch_size=8", "optimizer.learning_rate=1e-3"])
    merged = with_values(base, {"optimizer": {"steps": 40}, "task.label_words": ["a", "b"]})
    assert merged.optimizer.steps == 40
    assert (merged.optimizer.batch_size, merged.optimizer.learning_rate) == (8, 1e-3)
    assert merged.task.label_words == ["a", "b"]  # a list is a leaf, not merged


@pytest.mark.parametrize("strategy", ["replica", "zero3"])
@pytest.mark.parametrize("algorithm", ["dpsgd", "adamw", "dpgd-0th"])
def test_baselines_are_refused_under_a_distributed_strategy_before_they_start(algorithm, strategy):
    """Their workers could not start: refused (by the registry's capability check, which run
    calls first) before Ray, a tracking run or a directory exist."""
    from privzo.algorithms.registry import check_capabilities

    overrides = [f"optimizer.algorithm={algorithm}", f"parallel.strategy={strategy}"]
    config = load_config(None, [*overrides, "parallel.workers=2"])
    with pytest.raises(ConfigError) as error:
        check_capabilities(config)
    message = str(error.value)
    assert f"optimizer.algorithm={algorithm!r}" in message
    assert f"parallel.strategy={strategy!r}" in message


@pytest.mark.parametrize("algorithm", ["mezo", "dpzero", "dpzo-laplace"])
def test_zeroth_order_algorithms_load_under_replica(algorithm):
    from privzo.algorithms.registry import check_capabilities

    config = load_config(
        None,
        [f"optimizer.algorithm={algorithm}", "parallel.strategy=replica", "parallel.workers=2"],
    )
    assert config.parallel.strategy == "replica"
    check_capabilities(config)


TINY_DPZERO = REPO / "configs" / "runs" / "tiny-dpzero.yaml"  # reads the built-in dataset


@pytest.mark.parametrize(
    ("overrides", "source"),
    [
        ([], {"builtin_dataset": "demo-sentiment"}),
        (["task.train_path=mine.csv", "task.test_path=t.csv"], {"train_path": "mine.csv"}),
        (["task.data_dir=data/mine"], {"data_dir": "data/mine"}),
        (["task.hf_dataset=glue", "task.hf_subset=sst2"], {"hf_dataset": "glue"}),
        (["task.builtin_dataset=null", "task.data_dir=d"], {"data_dir": "d"}),
    ],
)
def test_a_data_source_given_later_replaces_the_config_files(overrides, source):
    task = load_config(TINY_DPZERO, overrides).task
    given = {key: getattr(task, key) for key in DATA_SOURCES if getattr(task, key) is not None}
    assert given == source


def test_a_data_source_in_a_later_file_replaces_the_earlier_files_with_its_companions(tmp_path):
    files = tmp_path / "files.yaml"
    files.write_text("task: {train_path: a.csv, test_path: b.csv}\n")
    directory = tmp_path / "dir.yaml"
    directory.write_text("task: {data_dir: data/mine}\n")
    task = load_config([TINY_DPZERO, files]).task
    assert (task.builtin_dataset, task.train_path, task.test_path) == (None, "a.csv", "b.csv")
    task = load_config([TINY_DPZERO, files, directory]).task
    assert (task.train_path, task.test_path, task.data_dir) == (None, None, "data/mine")
    hub = load_config(TINY_DPZERO, ["task.hf_dataset=glue", "task.hf_subset=sst2"])
    searched = {"task.train_path": "a.csv", "task.test_path": "b.csv"}  # a search's overrides
    task = with_values(hub, searched).task
    assert (task.hf_dataset, task.hf_subset, task.train_path) == (None, None, "a.csv")


def test_two_data_sources_in_one_file_or_one_command_are_refused_naming_both(tmp_path):
    both = tmp_path / "both.yaml"
    both.write_text("task:\n  builtin_dataset: demo-sentiment\n  train_path: mine.csv\n")
    with pytest.raises(ConfigError) as refused:
        load_config(both)
    message = str(refused.value)
    assert str(both) in message
    assert "task.builtin_dataset='demo-sentiment' and task.train_path='mine.csv'" in message
    with pytest.raises(
        ConfigError, match=re.escape("task.data_dir='d' and task.train_path='a.csv'")
    ):
        load_config(TINY_DPZERO, ["task.train_path=a.csv", "task.data_dir=d"])
    with pytest.raises(ConfigError, match="both give the training rows"):  # a dict, no file
        build_config({"task": {"data_dir": "d", "hf_dataset": "glue"}})


def test_a_test_file_without_a_training_file_is_refused():
    with pytest.raises(
        ConfigError, match=re.escape("task.test_path='t.csv' goes with task.train_path")
    ):
        load_config(TINY_DPZERO, ["task.test_path=t.csv"])


def test_an_unquoted_template_is_shown_with_how_to_quote_it(tmp_path):
    quoted_hint = "YAML reads an unquoted {...} as a mapping; quote the text"
    with pytest.raises(ConfigError) as refused:
        load_config(TINY_DPZERO, ["task.template={text}"])
    assert "task.template: Input should be a valid string (got {'text': None}: " in str(
        refused.value
    )
    assert quoted_hint in str(refused.value)
    unquoted = tmp_path / "task.yaml"
    unquoted.write_text("task:\n  template: {review}\n")
    with pytest.raises(ConfigError, match=re.escape(quoted_hint)):
        load_config([TINY_DPZERO, unquoted])


def test_an_override_with_nothing_after_the_equals_sign_is_refused():
    """YAML reads nothing as null: ``optimizer.learning_rate=`` (an unset shell variable) would
    otherwise be refused as "got None", or unset a key that takes null."""
    for item in ("optimizer.learning_rate=", "tracking.uri= "):
        key = item.split("=")[0]
        with pytest.raises(ConfigError, match=rf"override '{re.escape(item)}' has no value "):
            load_config(None, [item])
        with pytest.raises(ConfigError, match=rf"or {re.escape(key)}=null to unset it"):
            load_config(None, [item])
    assert load_config(None, ["tracking.uri=null"]).tracking.uri is None


def test_a_check_across_sections_is_named_by_its_keys_not_a_placeholder():
    with pytest.raises(ConfigError) as error:
        load_config(None, ["privacy.delta=0"])
    assert "<root>" not in str(error.value)
    assert str(error.value).endswith("\n  privacy.delta=0.0: approximate DP needs 0 < delta < 1")


def test_an_override_without_a_value_is_not_taken_for_a_missing_file():
    with pytest.raises(ConfigError) as error:
        load_config(["optimizer.steps"])
    assert str(error.value) == (
        "config file 'optimizer.steps' does not exist (an override is written key=value)"
    )
    with pytest.raises(ConfigError) as missing:
        load_config(["nowhere/run.yaml"])
    assert str(missing.value) == "config file 'nowhere/run.yaml' does not exist"


def test_a_config_file_that_holds_no_mapping_says_what_it_holds(tmp_path):
    listed = tmp_path / "list.yaml"
    listed.write_text("- optimizer\n- privacy\n")
    with pytest.raises(ConfigError, match=r"at the top level \(section: keys\), not a list"):
        load_config([listed])


def test_an_unknown_device_lists_the_devices_not_a_pattern():
    with pytest.raises(ConfigError) as error:
        load_config(None, ["model.device=tpu"])
    assert (
        "model.device: allowed: 'cpu', 'auto', 'cuda' or 'cuda:N' (GPU number N) (got 'tpu')"
    ) in str(error.value)
    assert load_config(None, ["model.device=cuda:1"]).model.device == "cuda:1"
