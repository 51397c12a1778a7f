"""Typed run configuration: one validated section per concern, composed into ``RunConfig``.

Configs load from YAML with ``key.sub=value`` overrides and are validated at load, so a bad
value fails with a message that names the field, the value and what is allowed, before any
model is built or anything is recorded.
"""

from __future__ import annotations

import copy
import string
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from privzo.algorithms.noise import NOISE

# Names a config may choose. What each algorithm is (family, mechanisms, layouts, views, its
# stepper) is registered in privzo.algorithms.registry, beneath which this module sits; a test
# (tests/unit/algorithms/test_registry.py) ties these Literals to the registries. The noise each
# algorithm adds, which decides the privacy rules at load, is read from
# privzo.algorithms.noise, and which accountant bounds which noise from the accountant classes.
AlgorithmName = Literal["mezo", "dpzero", "dpzo-laplace", "dpsgd", "adamw", "dpgd-0th"]
MechanismName = Literal["gaussian", "laplace", "lmo"]
LayoutName = Literal["single", "replica", "zero3"]
ALGORITHMS: tuple[str, ...] = get_args(AlgorithmName)
DEFAULT_NOISE_GRID = 1024


class ConfigError(ValueError):
    """A user error in a config: names the field, the value and what is allowed."""


MAX_CLIP = 1e6
"""Largest ``privacy.clip``. C bounds each per-example loss difference (or, for the first-order
baselines, gradient norm) and scales the noise, σ·C, added in fp32. Loss differences of real
models are O(1) to O(100), so a C above 1e6 clips nothing and only scales the noise: the noised
sum is then ≥ 1e6·σ while the signal stays O(B·100), and the fp32 step moves every weight by
noise alone (clip=1e30 finished with weights around 1e26; clip=1e308 overflowed fp32 at step
1). The shipped configs use C ≤ 50."""

MAX_STEPS = 10_000_000
"""Largest ``optimizer.steps``: what the accountant can carry. Calibrating σ with the PLD
accountant took 15 s at 10^6 steps, 211 s at 10^7 and did not finish within 300 s at 10^8
(2-core CPU, sample rate 0.032); 10^7 is also 100× the longest runs in the MeZO and DPZero
papers, and the trajectory holds one row per step in memory."""


class _Section(BaseModel):
    # inf / nan are never meaningful settings (a learning rate, an ε, a clip): reject them all
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class PeftConfig(_Section):
    """Options of the LoRA and prefix views (ignored by full and bitfit)."""

    lora_rank: int = Field(8, ge=1)
    lora_alpha: int = Field(16, ge=1)
    lora_target_modules: list[str] | None = Field(
        None, description="Module names to adapt; null = the architecture's q/v projections."
    )
    prefix_tokens: int = Field(5, ge=1)


class ModelConfig(_Section):
    """Which network to fine-tune and where it runs."""

    name_or_path: str = Field(
        "tiny-opt",
        description="HF hub id, local directory, or a built-in tiny model ('tiny-opt', "
        "'tiny-roberta', 'demo-opt-s', 'demo-opt-m', 'demo-opt-l').",
    )
    kind: Literal["auto", "causal", "masked"] = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = Field("cpu", pattern=r"^(cpu|auto|cuda(:\d+)?)$")
    trainable: Literal["full", "bitfit", "lora", "prefix"] = Field(
        "full", description="The PEFT view: which tensors the run perturbs and updates."
    )
    peft: PeftConfig = Field(default_factory=PeftConfig)
    tokenizer_use_fast: bool = Field(
        True,
        description="Load the fast (Rust) tokenizer; false asks for the slow Python one, as "
        "MeZO's OPT code did (use_fast=False). transformers 5 has fast tokenizers only: there "
        "false is refused when the tokenizer loads.",
    )
    revision: str | None = Field(
        None,
        min_length=1,
        description="Hub ids only: the branch, tag or commit to load (from_pretrained's "
        "revision); null = the default branch. The commit loaded is recorded either way.",
    )


class TaskConfig(_Section):
    """A prompt-based task scored from the LM head: a named preset or a custom prompt.

    A preset (sst2, sst5, snli, mnli, rte, trec, boolq) fills ``template``, ``label_words``,
    ``label_field`` and the hub source for the model's kind; anything set here wins. The text
    fields are the template's ``{placeholders}`` (``{mask}`` marks a masked LM's scored slot).
    """

    name: str = Field("prompt-classification", description="A preset name or the custom task.")
    builtin_dataset: str | None = Field(
        None, description="A dataset that ships with privzo: 'demo-sentiment' (synthetic)."
    )
    data_dir: str | None = Field(
        None, description="A directory with train / test files (as `privzo data prepare` writes)."
    )
    train_path: str | None = None
    test_path: str | None = None
    hf_dataset: str | None = Field(None, description="HF datasets id, e.g. 'glue'.")
    hf_subset: str | None = Field(None, description="HF datasets config, e.g. 'sst2'.")
    revision: str | None = Field(
        None,
        min_length=1,
        description="Hub datasets only (task.hf_dataset or a preset's source): the branch, tag "
        "or commit for load_dataset; null = the default branch.",
    )
    label_field: str | None = Field(None, description="null = the preset's, else 'label'.")
    template: str | None = Field(
        None,
        description="Prompt with {field} slots; null = the preset's (custom: "
        "'{sentence} It was', plus ' {mask} .' for masked LMs).",
    )
    label_words: list[str] | None = Field(None, min_length=2)
    label_word_prefix: str | None = Field(
        None, description="What joins prompt and label word; null = the preset's (a space)."
    )
    answer_field: str = Field(
        "answers", description="Generation tasks: the field with the list of reference answers."
    )
    max_new_tokens: int = Field(32, ge=1, description="Generation tasks: greedy decoding length.")
    examples_per_class: int | None = Field(
        None, ge=1, description="Few-shot k per class (LM-BFF / MeZO RoBERTa: 16 or 512)."
    )
    train_size: int | None = Field(
        None, ge=1, description="Sample this many training examples (MeZO OPT: 1000)."
    )
    test_size: int | None = Field(1000, ge=1)
    validation_size: int | None = Field(
        None,
        ge=1,
        description="Hold out this many training rows as a validation split (MeZO: 500). It is "
        "private data: in a private run its metric is not released unless "
        "tracking.log_private_diagnostics (a search that selects on it accounts for it).",
    )
    data_seed: int = 0
    skip_invalid_rows: bool = Field(
        False, description="Skip and count rows with a missing field or label instead of failing."
    )
    max_length: int | None = Field(
        None, ge=4, description="Longest prompt in tokens; null = what the model's positions allow."
    )

    @model_validator(mode="after")
    def _consistent(self) -> TaskConfig:
        if self.template is not None and not template_fields(self.template):
            raise ValueError(
                f"task.template={self.template!r} must contain at least one {{field}} slot"
            )
        if self.examples_per_class is not None and self.train_size is not None:
            raise ValueError("task.examples_per_class and task.train_size: set one, not both")
        return self


def template_fields(template: str) -> list[str]:
    """The row fields a template reads, in order (``{mask}`` is not a field).

    Raises ValueError for a malformed template or a slot that is not a plain field name: rows
    fill templates by name and as plain text.
    """
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as error:
        raise ValueError(f"template {template!r} is malformed: {error}") from None
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(
                f"template {template!r}: slot {{{name}}} must be a plain field name, like "
                "{question}"
            )
        names.append(name)
    return [name for name in dict.fromkeys(names) if name != "mask"]


FIRST_ORDER_PHYSICAL_BATCH_SIZE = 16
"""The first-order baselines' chunk when ``optimizer.physical_batch_size`` is null: a backward
keeps a gradient per example (Opacus), so their memory grows with the chunk, and 16 was their
default before the setting was shared with the zeroth-order loop."""


class FirstOrderConfig(_Section):
    """Options of the first-order baselines (dpsgd, adamw); zeroth-order runs ignore them."""

    update_rule: Literal["sgd", "adamw"] | None = Field(
        None, description="null = sgd for dpsgd (DP-SGD), adamw for adamw."
    )
    weight_decay: float = Field(0.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "physical_batch_size" in data:
            raise ValueError(
                "physical_batch_size moved to optimizer.physical_batch_size (one setting for "
                "every algorithm); set it there and remove it from optimizer.first_order"
            )
        return data


class OptimizerConfig(_Section):
    """The training algorithm and its schedule."""

    algorithm: str = "dpzero"
    steps: int = Field(500, gt=0)  # and ≤ MAX_STEPS (_bounded)
    learning_rate: float = Field(1e-4, gt=0)
    lr_schedule: Literal["constant", "linear"] = "constant"
    perturbation_scale: float = Field(1e-3, gt=0, description="ZO smoothing radius (MeZO's ε).")
    direction: Literal["gaussian", "sphere", "rademacher"] = "gaussian"
    generator: Literal["auto", "philox", "torch-blocks"] = Field(
        "auto",
        description="Generator of the directions: counter-based 'philox' (replays on any device; "
        "on CUDA drawn inside fused Triton kernels) or 'torch-blocks' (the device's torch "
        "generator per 65,536-element block, faster on CPU, replays on the device type it ran "
        "on); 'auto' is philox on CUDA, torch-blocks on CPU.",
    )
    batch_size: int = Field(16, ge=1, description="Expected batch size (Poisson: p·N).")
    eval_batch_size: int = Field(64, ge=1)
    physical_batch_size: int | None = Field(
        None,
        ge=1,
        description="Most examples per forward (and backward): larger batches run in chunks "
        "of at most this many, at the same perturbation for a zeroth-order step (the same "
        "per-example losses, peak memory of the chunk). null = the whole batch in one forward "
        "for the zeroth-order algorithms, and 16 for the first-order baselines, whose "
        "per-example gradients grow with the chunk (Opacus' BatchMemoryManager for dpsgd).",
    )
    first_order: FirstOrderConfig = Field(default_factory=FirstOrderConfig)
    dpgd_max_parameters: int = Field(
        50_000_000,
        ge=1,
        description="dpgd-0th refuses more trainable parameters than this: it holds a "
        "d-dimensional noise vector (one extra copy of the trainable weights).",
    )

    @field_validator("steps")
    @classmethod
    def _bounded(cls, steps: int) -> int:
        if steps > MAX_STEPS:
            raise ValueError(
                "more steps than the accountant can carry (see privzo.config.MAX_STEPS); "
                f"allowed: 1 ≤ steps ≤ {MAX_STEPS:_}"
            )
        return steps

    @model_validator(mode="after")
    def _known_algorithm(self) -> OptimizerConfig:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(
                f"optimizer.algorithm={self.algorithm!r} is unknown; allowed: {list(ALGORITHMS)}"
            )
        return self

    @property
    def is_private(self) -> bool:
        return NOISE[self.algorithm].private

    @property
    def first_order_physical_batch_size(self) -> int:
        """What a first-order baseline splits logical batches into (see physical_batch_size)."""
        return self.physical_batch_size or FIRST_ORDER_PHYSICAL_BATCH_SIZE


LMO_MIN_GAMMA_SHAPE = 0.05
"""Below it a Gamma(shape) draw underflows to R = 0 (noise scale σC/R infinite) too often:
numpy's sampler returns 0 with probability about exp(-744·shape), 1e-16 at 0.05, 8e-4 at
0.01."""


class LmoConfig(_Section):
    """LMO-DP noise: Laplace(0, 1/R)·σC with R drawn from a weighted mixture of Gamma(shape,
    scale), Exponential(rate) and Uniform(low, high) (privzo.privacy.mechanisms.LmoMechanism).
    The defaults are illustrative, not values from the LMO-DP paper."""

    weights: list[float] = Field(
        default_factory=lambda: [0.4, 0.3, 0.3],
        description="Mixture weights of the Gamma, Exponential and Uniform parts (sum to 1).",
    )
    gamma_shape: float = Field(3.0, ge=LMO_MIN_GAMMA_SHAPE)
    gamma_scale: float = Field(0.5, gt=0)
    exponential_rate: float = Field(1.0, gt=0)
    uniform_low: float = Field(0.5, gt=0)
    uniform_high: float = Field(1.5, gt=0)

    @model_validator(mode="after")
    def _valid_mixture(self) -> LmoConfig:
        if len(self.weights) != 3 or any(w < 0 for w in self.weights):
            raise ValueError(
                f"privacy.lmo.weights={self.weights}: three non-negative weights (Gamma, "
                "Exponential, Uniform) are required"
            )
        if abs(sum(self.weights) - 1.0) > 1e-9:
            raise ValueError(f"privacy.lmo.weights={self.weights} must sum to 1")
        if self.uniform_high <= self.uniform_low:
            raise ValueError(
                f"privacy.lmo.uniform_high={self.uniform_high} must exceed "
                f"uniform_low={self.uniform_low}"
            )
        return self


class PrivacyConfig(_Section):
    """The target guarantee and how it is met and accounted."""

    epsilon: float = Field(2.0, gt=0)
    delta: float = Field(1e-5, ge=0, lt=1)
    clip: float = Field(1.0, gt=0, description="Per-example clipping threshold C (≤ 1e6).")
    noise_multiplier: float | None = Field(
        None, gt=0, description="Fixed σ; when null, σ is calibrated to (epsilon, delta)."
    )
    accountant: Literal["pld", "rdp", "pure", "numeric"] = "pld"
    sampler: Literal["poisson", "shuffle"] = "poisson"
    adjacency: Literal["add-remove"] = "add-remove"
    mechanism: MechanismName | None = Field(
        None,
        description="The scalar noise of a zeroth-order private run; null = the algorithm's "
        "(dpzero: gaussian, dpzo-laplace: laplace). 'lmo' needs accountant 'numeric'.",
    )
    lmo: LmoConfig = Field(default_factory=LmoConfig)
    noise_grid: int | None = Field(
        DEFAULT_NOISE_GRID,
        ge=16,
        le=2**20,
        description="Grid points per noise scale σC of a zeroth-order run's scalar noise: γ·k "
        "with γ = σC/noise_grid and k an exact discrete Gaussian / Laplace (or, for lmo, the "
        "rounded Laplace given its random scale) drawn with integer arithmetic (safe from "
        "floating-point attacks) and accounted as such. null = numpy's float sampler and the "
        "continuous accountants (not safe from those attacks).",
    )

    @field_validator("clip")
    @classmethod
    def _bounded_clip(cls, clip: float) -> float:
        if clip > MAX_CLIP:
            raise ValueError(
                "a threshold this large clips nothing and scales the noise past what a float32 "
                "step carries (see privzo.config.MAX_CLIP); allowed: 0 < clip ≤ 1e6"
            )
        return clip


class ParallelConfig(_Section):
    """How a run is laid out: one process, Ray Train replicas, or DeepSpeed ZeRO-3 ranks."""

    strategy: LayoutName = "single"
    workers: int = Field(1, ge=1)
    use_gpu: bool = False
    max_failures: int = Field(0, ge=0, description="Worker failures Ray Train recovers from.")
    gpu_memory_gb: float = Field(
        80.0, gt=0, description="Memory of one GPU (GiB), for the planner's fit check."
    )
    storage_path: str | None = Field(
        None,
        description="Where Ray Train keeps checkpoints (shared storage on a cluster); "
        "null = <output-dir>/ray.",
    )
    env_vars: dict[str, str] = Field(
        default_factory=dict, description="Environment of the Ray workers (runtime_env)."
    )

    @model_validator(mode="after")
    def _one_worker_when_single(self) -> ParallelConfig:
        if self.strategy == "single" and self.workers != 1:
            raise ValueError(
                f"parallel.workers={self.workers} with parallel.strategy='single'; allowed: "
                "workers=1, or strategy 'replica' / 'zero3'"
            )
        return self


class TrackingConfig(_Section):
    backend: Literal["mlflow", "none"] = "mlflow"
    uri: str | None = Field(None, description="Tracking URI; null = sqlite under the output root.")
    experiment: str = "privzo"
    run_name: str | None = None
    log_every: int = Field(10, ge=1)
    log_private_diagnostics: bool = Field(
        False,
        description="Log a private run's training loss, step times and non-finite / empty-batch "
        "counts. They depend on the private data and are not covered by the run's guarantee, "
        "so they are off by default (the progress bar still shows them on the console).",
    )


class RunConfig(_Section):
    """Everything one run needs; the unit that is saved beside its results."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    seed: int = Field(0, ge=0, description="Public seed of the perturbation directions.")
    eval_before: bool = True
    save_model: bool = Field(
        False, description="Also save the fine-tuned weights (the trajectory alone rebuilds them)."
    )

    @model_validator(mode="after")
    def _private_settings_consistent(self) -> RunConfig:
        _check_zero3_forwards(self)
        if not self.optimizer.is_private:
            return self
        mechanism = self.mechanism
        if self.privacy.sampler != "poisson":
            raise ValueError(
                f"privacy.sampler={self.privacy.sampler!r} with a private algorithm: the "
                "accountants here assume Poisson sampling; allowed: 'poisson'"
            )
        # Imported here: the accountants load dp_accounting (seconds), which a config that
        # fails before this point, or a non-private one, never needs.
        from privzo.privacy.accountants import ACCOUNTANTS, accountants_for

        name = self.privacy.accountant
        accountant = ACCOUNTANTS[name]
        if not accountant.bounds(mechanism):
            raise ValueError(
                f"privacy.accountant={name!r} with optimizer.algorithm="
                f"{self.optimizer.algorithm!r} cannot account the {mechanism!r} mechanism: the "
                f"{accountant.title} accountant bounds only {list(accountant.mechanisms)}; "
                f"allowed: {accountants_for(mechanism)}"
            )
        if not accountant.allows_zero_delta and self.privacy.delta <= 0:
            raise ValueError(
                f"privacy.delta={self.privacy.delta}: approximate DP needs 0 < delta < 1"
            )
        if self.noise_grid is not None and not accountant.bounds(mechanism, grid=True):
            raise ValueError(
                f"privacy.accountant={name!r} with privacy.noise_grid={self.noise_grid}: it "
                f"accounts only the continuous {mechanism} mechanism, and the run draws discrete "
                f"noise on a grid; allowed: {accountants_for(mechanism, grid=True)}, or "
                "privacy.noise_grid=null for the float sampler (not safe from floating-point "
                "attacks)"
            )
        _check_test_split_is_not_private(self)
        return self

    @property
    def releases_diagnostics(self) -> bool:
        """Whether data-dependent figures (training loss, times, peak memory, counts, exact
        validation metrics) may be released: always for a non-private run, for a private one
        only with ``tracking.log_private_diagnostics`` (outside its guarantee)."""
        return not self.optimizer.is_private or self.tracking.log_private_diagnostics

    @property
    def noise_grid(self) -> int | None:
        """The grid of this run's scalar noise (None: continuous, or no scalar noise)."""
        if not NOISE[self.optimizer.algorithm].scalar:
            return None
        return self.privacy.noise_grid

    @property
    def mechanism(self) -> str | None:
        if not self.optimizer.is_private:
            return None
        return self.privacy.mechanism or NOISE[self.optimizer.algorithm].default_mechanism


def _check_test_split_is_not_private(config: RunConfig) -> None:
    """A private run's test metrics are released exactly, so its test rows must not be the
    private training file's: with ``task.train_path`` alone the test split would be carved out
    of it. (Other sources have their own test split: data_dir's test file, a preset's hub split,
    the built-in dataset's.)"""
    task = config.task
    if task.train_path is None or task.test_path is not None:
        return
    if config.tracking.log_private_diagnostics:
        return  # the user releases data-dependent figures outside the guarantee
    raise ValueError(
        "task.train_path without task.test_path in a private run: the test split would be "
        "carved out of the private training file and its metrics released exactly, outside the "
        "guarantee; give task.test_path (a separate, public test file), or set "
        "tracking.log_private_diagnostics=true to release them anyway"
    )


def _check_zero3_forwards(config: RunConfig) -> None:
    """Refuse at load micro-batches under zero3. (Which algorithms a layout runs is the
    registry's to say: ``privzo.algorithms.registry.check_capabilities``, run by preflight.)"""
    if config.parallel.strategy == "zero3" and config.optimizer.physical_batch_size is not None:
        # every ZeRO-3 forward gathers the weights collectively, so all ranks must make the
        # same number of forwards; micro-batches of Poisson batches of different sizes do not
        raise ValueError(
            f"optimizer.physical_batch_size={config.optimizer.physical_batch_size} with "
            "parallel.strategy='zero3': ranks would make different numbers of forwards, and "
            "each ZeRO-3 forward is a collective; allowed: null (or strategy 'single'/'replica')"
        )


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
        keys = dotted.strip().split(".")
        node = result
        for key in keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {key!r} is not a section")
            node = child
        node[keys[-1]] = _parse_scalar(raw)
    return result


def _format_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "<root>"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        value = item.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"  {field}: {message}{shown}")
    return "\n".join(lines)


def build_config(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(error, source)) from None
    return config


def load_config(
    path: str | Path | list[str | Path] | None = None, overrides: list[str] | None = None
) -> RunConfig:
    """Load YAML run config(s) (the defaults when ``path`` is None) and apply overrides.

    Several files merge in order, later ones winning key by key, so a model file
    (configs/models/) and a task file (configs/tasks/) combine with a run file.
    """
    paths = [] if path is None else path if isinstance(path, list) else [path]
    data: dict[str, Any] = {}
    for item in paths:
        data = _merge(data, _read_yaml(Path(item)))
    data = apply_overrides(data, overrides or [])
    return build_config(data, " + ".join(str(item) for item in paths) or "defaults")


def _read_yaml(path: Path) -> dict[str, Any]:
    """A YAML config file's top-level mapping; every fault names the file (and line, key)."""
    text = _read_text(path)
    try:
        loaded = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as error:
        raise ConfigError(_yaml_error_message(path, text, error)) from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
    return loaded or {}


def _read_text(path: Path) -> str:
    if path.is_dir():
        raise ConfigError(f"config file {str(path)!r} is a directory; give a YAML file in it")
    if not path.exists():
        raise ConfigError(f"config file {str(path)!r} does not exist")
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


# Public names for the other config modules (search, study and synthetic-study configs).
Section = _Section
format_validation_error = _format_validation_error
read_yaml = _read_yaml

_SectionT = TypeVar("_SectionT", bound=BaseModel)


def validate_section(section: type[_SectionT], data: Any, source: str) -> _SectionT:
    """``section.model_validate(data)``, with a validation error as a ConfigError that names
    the field, the value and what is allowed."""
    try:
        return section.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(error, source)) from None


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
    for key, value in dotted_items(values).items():
        *sections, leaf = key.split(".")
        node = data
        for section in sections:
            child = node.get(section)
            if not isinstance(child, dict):
                raise ConfigError(f"{key}: {section!r} is not a config section")
            node = child
        node[leaf] = value
    return build_config(data, source)
