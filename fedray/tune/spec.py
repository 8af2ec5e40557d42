"""The sweep file: schema, loading and validation (everything is checked before Ray starts).

A sweep file is YAML::

    name: fedprox-mu                   # sweep id = <name>-<YYYYmmdd-HHMMSS> (default: the file's stem)
    base: ../examples/fedprox_digits.yaml   # a run config (path relative to this file) or a mapping
    overrides: [train.rounds=15]        # --set style overrides applied to the base
    per_algorithm:                      # overrides applied only to trials of that algorithm
      moon: [model.projection_dim=64]
    space:                              # the search space: any run-config key -> one domain
      algorithm.mu: {loguniform: [0.001, 1]}
      data.alpha: {grid: [0.1, 0.5]}
    num_samples: 2                      # samples of the non-grid keys per grid point
    metric: test_accuracy               # default: the task's headline (test_rmse for a regression...)
    mode: max                           # default: the task's direction for its headline, min for losses and errors
    reference: fedavg                   # comparison.md's paired differences are against it (needs algorithm.name in the space;
                                        # default: fedavg when the space has it, else the space's first algorithm)
    scheduler: {type: asha, grace_period: 2, reduction_factor: 2}   # or: fifo
    search: random                      # or: optuna (TPE; needs the `optuna` extra)
    max_concurrent_trials: 2
    max_failures: 1
    driver_cpus: 1
    reuse_workers: true                 # keep trial processes and worker pools warm between trials
    output: {dir: sweeps}

Domains (one per key): ``grid`` (every value, in every sample), ``choice`` (one value at random),
``uniform: [low, high]``, ``loguniform: [low, high]`` (low > 0), ``randint: [low, high]`` (an integer,
``high`` exclusive like ``range`` and ``tune.randint``).

A trial's run config is built as: base ← ``overrides`` ← ``per_algorithm[<its algorithm>]`` ← the
trial's sampled values. Before Ray starts, one run config per trial shape is built and validated: every
combination of the ``grid``/``choice`` values with the low and the high end of each numeric range, so an
invalid key, an out-of-range bound or a key that one algorithm of an ``algorithm.name`` grid does not
have fails with the run config's own message, naming the trial shape. Each shape's data is partitioned
and its algorithm built as ``fedray run`` does before Ray starts (:func:`fedray.runtime.experiment.prepare_data`),
so the algorithm's own checks (e.g. Hetero-SSFL refusing ``eval.personalized``) fail here too.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
import math
import re
from pathlib import Path
from typing import Any, Iterator, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedray.config import ConfigError, RunConfig, apply_overrides, is_reference, read_yaml, set_key, validate_config
from fedray.config.loader import validation_config_error
from fedray.config.schema import HF_PREFIX, PERSONAL_SPREAD, TASK_REPORTS, metric_direction

Scalar = Union[bool, int, float, str]
DOMAINS = ("grid", "choice", "uniform", "loguniform", "randint")
#: The round metrics a sweep may rank by (what the engine reports on evaluated rounds): every built-in
#: task's test metrics, the training loss, and its personalised headline with that headline's spread.
METRICS = tuple(
    dict.fromkeys(
        [f"test_{name}" for report in TASK_REPORTS.values() for name in report.metric_names]
        + ["train_loss"]
        + [f"personal_{report.headline}{suffix}" for report in TASK_REPORTS.values() for suffix in ("", *PERSONAL_SPREAD, "_std")]
    )
)


def default_metric(task: str) -> str:
    """``test_<headline>`` of a built-in task (``test_accuracy`` for classification)."""
    return f"test_{TASK_REPORTS[task].headline}" if task in TASK_REPORTS else "test_loss"


#: The most trials one sweep may have: Tune keeps every trial in memory and in its experiment state.
MAX_TRIALS = 10_000
#: The most trial shapes validated before Ray starts (each builds its data partition and algorithm).
MAX_TRIAL_SHAPES = 1_000
#: Keys PBT may change in the middle of a trial (the others define the data, model or run length).
PBT_FIXED_KEYS = ("train.rounds", "algorithm.name", "algorithm.architectures", "algorithm.arch_assignment")
#: Run-config keys naming a local file or directory a trial reads (a trial runs in another working directory).
PATH_KEYS = (
    "data.root",
    "data.path",
    "data.test_path",
    "data.tokenizer",
    "model.init",
    "systems.devices.file",
    "systems.availability.trace_file",
    "output.client_state_dir",
)
#: Run-config keys whose value is a path after a prefix (``model.name: hf:<directory>``), pinned like :data:`PATH_KEYS`.
PREFIXED_PATH_KEYS = {"model.name": HF_PREFIX}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Domain(_Strict):
    """One key's search domain: exactly one of ``grid``, ``choice``, ``uniform``, ``loguniform``, ``randint``."""

    kind: Literal[DOMAINS]  # type: ignore[valid-type]
    values: list[Scalar]  # grid/choice: the values; ranges: [low, high]

    @model_validator(mode="before")
    @classmethod
    def _from_mapping(cls, raw: Any) -> Any:
        if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in DOMAINS:
            raise ValueError(f"expected a mapping with exactly one of {', '.join(DOMAINS)}, e.g. {{grid: [0.1, 0.5]}}")
        kind, values = next(iter(raw.items()))
        if not isinstance(values, list) or not values:
            raise ValueError(f"{kind}: expected a non-empty list")
        return {"kind": kind, "values": values}

    @model_validator(mode="after")
    def _check_values(self) -> "Domain":
        if self.kind in ("grid", "choice"):
            kinds = {_value_kind(v) for v in self.values}
            if len(kinds) > 1:
                raise ValueError(f"{self.kind}: values must all be numbers, all strings or all booleans (got {self.values})")
            return self
        if len(self.values) != 2 or any(_value_kind(v) != "number" for v in self.values):
            raise ValueError(f"{self.kind}: expected [low, high] numbers (got {self.values})")
        low, high = self.values
        if not low < high:
            raise ValueError(f"{self.kind}: low must be < high (got {self.values})")
        if self.kind == "loguniform" and low <= 0:
            raise ValueError(f"loguniform: low must be > 0 (got {self.values})")
        if self.kind == "randint" and not all(isinstance(v, int) for v in self.values):
            raise ValueError(f"randint: low and high must be integers (got {self.values})")
        return self

    def representative_values(self) -> list[Scalar]:
        """The values validated before Ray starts: every listed value, or a range's two ends."""
        if self.kind in ("grid", "choice"):
            return list(self.values)
        low, high = self.values
        return [low, high - 1] if self.kind == "randint" else [low, high]

    def to_tune(self) -> Any:
        """The Ray Tune search-space object for this domain."""
        from ray import tune

        if self.kind == "grid":
            return tune.grid_search(list(self.values))
        if self.kind == "choice":
            return tune.choice(list(self.values))
        return getattr(tune, self.kind)(*self.values)

    def to_yaml(self) -> dict[str, list[Scalar]]:
        return {self.kind: list(self.values)}


def _value_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, (int, float)) else "string"


class SchedulerSpec(_Strict):
    """``fifo`` runs every trial to the end; ``asha`` (asynchronous successive halving) stops a trial at
    a rung (``grace_period`` · ``reduction_factor``^k rounds) when its metric is outside the best
    1/``reduction_factor`` of the trials that reached that rung; ``pbt`` (population-based training)
    every ``perturbation_interval`` rounds restarts a trial of the worst ``quantile_fraction`` from the
    engine checkpoint of a trial of the best one, with the donor's swept values perturbed."""

    type: Literal["fifo", "asha", "pbt"] = "fifo"
    grace_period: int = Field(2, ge=1, description="asha: rounds every trial runs before it can be stopped")
    reduction_factor: float = Field(2.0, gt=1, description="asha: keep the best 1/reduction_factor at each rung")
    perturbation_interval: int = Field(2, ge=1, description="pbt: rounds between exploit/explore decisions")
    quantile_fraction: float = Field(0.25, gt=0, le=0.5, description="pbt: fraction of trials that exploit / are cloned")
    resample_probability: float = Field(0.25, ge=0, le=1, description="pbt: chance to resample a value instead of x0.8/x1.2")
    synch: bool = Field(False, description="pbt: wait for every trial at each perturbation (reproducible decisions)")


class SearchSpec(_Strict):
    """``random``: Tune's basic variant generator (every ``grid`` key enumerated, the others sampled at
    random, ``num_samples`` times). ``optuna``: Optuna's TPE sampler (``pip install 'fedray[optuna]'``),
    which samples and so does not take ``grid`` domains."""

    type: Literal["random", "optuna"] = "random"
    seed: int | None = Field(None, description="seed of the search's random sampling (None: unseeded)")


class SweepOutput(_Strict):
    dir: str = Field("sweeps", description="where sweeps/<sweep-id>/ is created")


class SweepSpec(_Strict):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$")
    base: dict[str, Any] = Field(default_factory=dict, description="the base run config, inlined")
    overrides: list[str] = Field(default_factory=list)
    per_algorithm: dict[str, list[str]] = Field(default_factory=dict)
    space: dict[str, Domain]
    num_samples: int = Field(1, ge=1)
    metric: str | None = Field(None, description="the metric trials are ranked by (None: test_<headline> of the base config's data.task)")
    mode: Literal["max", "min"] | None = Field(None, description="None: the task's direction for its headline, min for losses and errors")
    reference: str | None = Field(
        None,
        min_length=1,
        description="the algorithm comparison.md's paired differences are against: one of the space's algorithm.name "
        "values (None: fedavg when the space has it, else the space's first algorithm)",
    )
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    search: SearchSpec = Field(default_factory=SearchSpec)
    max_concurrent_trials: int | None = Field(None, ge=1, description="None: as many as the resources allow")
    max_failures: int = Field(1, ge=0, description="retries of a crashed trial (from its last checkpoint)")
    driver_cpus: float = Field(1.0, gt=0, description="CPUs reserved for each trial's driver (bundle 0)")
    reuse_workers: bool = Field(
        True,
        description="a trial process, its server and its workers stay warm for the next trial with the same "
        "resources (in the same placement group); false: every trial starts its own",
    )
    output: SweepOutput = Field(default_factory=SweepOutput)

    @field_validator("scheduler", "search", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"type": value} if isinstance(value, str) else value

    @field_validator("space")
    @classmethod
    def _non_empty(cls, space: dict[str, Domain]) -> dict[str, Domain]:
        if not space:
            raise ValueError("give at least one key to sweep, e.g. data.alpha: {grid: [0.1, 0.5]}")
        return space

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, metric: str | None) -> str | None:
        if metric is not None and metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r} (allowed: {', '.join(METRICS)})")
        return metric

    @model_validator(mode="after")
    def _defaults_and_combinations(self) -> "SweepSpec":
        if self.reference is not None:
            domain = self.space.get("algorithm.name")
            if domain is None:
                raise ValueError(f"reference {self.reference!r} compares algorithms: the space must sweep algorithm.name")
            if domain.kind not in ("grid", "choice") or self.reference not in domain.values:
                listed = ", ".join(map(str, domain.values)) if domain.kind in ("grid", "choice") else f"a {domain.kind} domain"
                raise ValueError(f"reference {self.reference!r} is not one of the space's algorithm.name values ({listed})")
        if self.search.type == "optuna":
            grids = [key for key, domain in self.space.items() if domain.kind == "grid"]
            if grids:
                raise ValueError(f"search optuna samples the space and takes no grid domain: use choice for {', '.join(grids)}")
        if self.scheduler.type == "pbt":
            if self.search.type != "random":
                raise ValueError("scheduler pbt samples its own population: use search: random")
            grids = [key for key, domain in self.space.items() if domain.kind == "grid"]
            if grids:
                raise ValueError(
                    f"scheduler pbt copies the donor's values into a cloned trial, which a grid cannot express: use choice for {', '.join(grids)}"
                )
            fixed = [key for key in self.space if key in PBT_FIXED_KEYS or not key.startswith(("train.", "algorithm."))]
            if fixed:
                raise ValueError(
                    f"scheduler pbt can only change train.* and algorithm.* hyperparameters during a trial, not {', '.join(fixed)}"
                )
        return self

    # ------------------------------------------------------------------ derived facts
    @property
    def swept_keys(self) -> list[str]:
        return list(self.space)

    @property
    def num_trials(self) -> int:
        """Trials the sweep will run: the grid's size × ``num_samples`` (``num_samples`` for Optuna)."""
        grid_points = math.prod(len(d.values) for d in self.space.values() if d.kind == "grid")
        return self.num_samples * grid_points

    def param_space(self) -> dict[str, Any]:
        """The Tune ``param_space``: flat, keyed by the run-config key (``"algorithm.mu"``)."""
        return {key: domain.to_tune() for key, domain in self.space.items()}

    def trial_config(self, values: dict[str, Any]) -> RunConfig:
        """The validated run config of the trial with the swept ``values``."""
        raw = copy.deepcopy(self.base)
        apply_overrides(raw, self.overrides)
        algorithm = values.get("algorithm.name", (raw.get("algorithm") or {}).get("name", "fedavg"))
        apply_overrides(raw, self.per_algorithm.get(algorithm, []))
        for key, value in values.items():
            set_key(raw, key, value, source="space: ")
        from fedray.plugins import validate_plugins  # imports the algorithms (torch): only when validating

        return validate_plugins(validate_config(raw))

    def trial_shapes(self) -> Iterator[dict[str, Scalar]]:
        """Every combination of each key's representative values (see the module docstring)."""
        keys = list(self.space)
        for combination in itertools.product(*(self.space[k].representative_values() for k in keys)):
            yield dict(zip(keys, combination))

    def to_yaml(self) -> str:
        data = self.model_dump(mode="json")
        data["space"] = {key: domain.to_yaml() for key, domain in self.space.items()}
        return yaml.safe_dump(data, sort_keys=False)


def parse_sweep(raw: dict[str, Any], source: str | Path, base_dir: Path) -> SweepSpec:
    """Validate a raw sweep mapping (``base`` as a path relative to ``base_dir`` or a mapping) and
    every trial shape's run config; raises :class:`ConfigError` naming the key and what is allowed."""
    raw = dict(raw)
    raw.setdefault("name", Path(source).stem)
    base = raw.get("base", {})
    if isinstance(base, str):
        raw["base"] = read_yaml(base_dir / base)
    elif base is not None and not isinstance(base, dict):
        raise ConfigError("base", f"expected a run-config path or mapping (got {base!r})", within=f"sweep file {source}")
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as error:
        raise validation_config_error(error, SweepSpec, within=f"sweep file {source}") from None
    _resolve_paths(spec)
    _check_trials(spec, source)
    return spec


def load_sweep(
    path: str | Path,
    overrides: list[str] = (),
    space: list[str] = (),
    num_samples: int | None = None,
    max_concurrent_trials: int | None = None,
) -> SweepSpec:
    """Read and validate a sweep file; ``overrides`` are appended to its ``overrides``, ``space``
    (``KEY=KIND:[VALUES]`` strings, see :func:`parse_space_option`) replaces or adds keys of its space,
    and ``num_samples`` / ``max_concurrent_trials`` replace the file's values when given."""
    path = Path(path)
    raw = read_yaml(path)
    raw["overrides"] = list(raw.get("overrides") or []) + list(overrides)
    if space:
        raw["space"] = {**(raw.get("space") or {}), **dict(parse_space_option(option) for option in space)}
    if num_samples is not None:
        raw["num_samples"] = num_samples
    if max_concurrent_trials is not None:
        raw["max_concurrent_trials"] = max_concurrent_trials
    return parse_sweep(raw, path, path.parent)


def parse_space_option(option: str) -> tuple[str, dict[str, Any]]:
    """``"data.alpha=grid:[0.1, 0.5]"`` -> ``("data.alpha", {"grid": [0.1, 0.5]})`` (the values are YAML)."""
    key, equals, domain = option.partition("=")
    kind, colon, values = domain.partition(":")
    shown = option if len(option) <= 80 else option[:77] + "..."
    kind = kind.strip()
    if not equals or not key.strip() or not colon or kind not in DOMAINS:
        raise ConfigError(
            f"--space {shown!r}",
            f"expected KEY=KIND:[VALUES] with KIND one of {', '.join(DOMAINS)}, "
            "e.g. --space data.alpha=grid:[0.1,0.5] or --space train.lr=loguniform:[0.001,0.1]",
            within=None,
        )
    try:
        parsed = yaml.safe_load(values)
    except yaml.YAMLError:
        parsed = None
    if not isinstance(parsed, list):
        raise ConfigError(f"--space {shown!r}", f"the values must be a YAML list, e.g. {kind}:[0.1, 0.5]", within=None)
    return key.strip(), {kind: [_number_or_value(value) for value in parsed]}


_EXPONENT_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")


def _number_or_value(value: Any) -> Any:
    """YAML 1.1 reads ``1e-3`` (no dot) as a string: a command line means the number."""
    return float(value) if isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value) else value


def shadowed_overrides(spec: SweepSpec, overrides: list[str]) -> list[str]:
    """The ``KEY=VALUE`` overrides whose key the space sweeps (the trial's sampled value wins)."""
    return [override for override in overrides if override.partition("=")[0].strip() in spec.space]


def _resolve_paths(spec: SweepSpec) -> None:
    """Trials run in Ray workers whose working directory is not the caller's: pin the relative paths
    a trial reads (:data:`PATH_KEYS`, :data:`PREFIXED_PATH_KEYS`; wherever the sweep sets them: the base,
    ``overrides``, ``per_algorithm`` or the space) and the sweep's output directory to the caller's directory."""
    data = spec.base.setdefault("data", {})
    if isinstance(data, dict):
        data.setdefault("root", "data")  # the default root is relative too
    for key in (*PATH_KEYS, *PREFIXED_PATH_KEYS):
        section, _, name = key.rpartition(".")
        node: Any = spec.base
        for part in section.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and name in node:
            node[name] = _absolute(node[name], PREFIXED_PATH_KEYS.get(key, ""))
    spec.overrides = [_absolute_override(override) for override in spec.overrides]
    spec.per_algorithm = {algorithm: [_absolute_override(o) for o in overrides] for algorithm, overrides in spec.per_algorithm.items()}
    for key, domain in spec.space.items():
        if (key in PATH_KEYS or key in PREFIXED_PATH_KEYS) and domain.kind in ("grid", "choice"):
            domain.values = [_absolute(value, PREFIXED_PATH_KEYS.get(key, "")) for value in domain.values]
    spec.output.dir = str(Path(spec.output.dir).resolve())


def _absolute(value: Any, prefix: str = "") -> Any:
    """A relative local path (after ``prefix``, when the key has one) made absolute against the current
    directory; a URI, a value without the prefix (a built-in ``model.name: cnn_small``) or one that is
    not a string (the run config's validation refuses it with its own message), as it is."""
    from fedray.tracking.sync import is_uri  # pyarrow: only when a sweep is loaded

    if not isinstance(value, str) or not value.startswith(prefix) or is_uri(value.removeprefix(prefix)):
        return value
    return prefix + str(Path(value.removeprefix(prefix)).expanduser().absolute())


def _absolute_override(override: str) -> str:
    """A ``KEY=VALUE`` override of a path key (:data:`PATH_KEYS`, :data:`PREFIXED_PATH_KEYS`) with its path
    made absolute (JSON-quoted, which YAML reads back as the same string); any other override as it is."""
    key, sep, text = override.partition("=")
    key = key.strip()
    if not sep or (key not in PATH_KEYS and key not in PREFIXED_PATH_KEYS):
        return override
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    pinned = _absolute(value, PREFIXED_PATH_KEYS.get(key, ""))
    return override if pinned == value else f"{key}={json.dumps(pinned)}"


def _check_trials(spec: SweepSpec, source: str | Path) -> None:
    from fedray.algorithms import ALGORITHMS

    unknown = [name for name in spec.per_algorithm if name not in ALGORITHMS and not is_reference(name)]
    if unknown:
        raise ConfigError(
            "per_algorithm", f"unknown algorithm(s) {', '.join(unknown)} (allowed: {', '.join(ALGORITHMS)})", within=f"sweep file {source}"
        )
    if spec.search.type == "optuna" and importlib.util.find_spec("optuna") is None:
        raise ConfigError(
            "search", "optuna is not installed; pip install 'fedray[optuna]' (or use search: random)", within=f"sweep file {source}"
        )
    if spec.num_trials > MAX_TRIALS:
        raise ConfigError(
            "num_samples",
            f"the sweep has {spec.num_trials:,} trials "
            f"(num_samples {spec.num_samples} x {spec.num_trials // spec.num_samples:,} grid points); at most "
            f"{MAX_TRIALS:,} per sweep: lower num_samples (--num-samples) or shrink the grid (--space)",
            within=f"sweep file {source}",
        )
    num_shapes = math.prod(len(d.representative_values()) for d in spec.space.values())
    if num_shapes > MAX_TRIAL_SHAPES:
        raise ConfigError(
            "space",
            f"{num_shapes:,} trial shapes to validate (every grid/choice "
            f"value x both ends of every range); at most {MAX_TRIAL_SHAPES:,}: sweep fewer keys at once",
            within=f"sweep file {source}",
        )
    from fedray.runtime.experiment import prepare_data

    datasets: dict[str, Any] = {}  # trial shapes that differ only outside `data`/`seed` share one partition
    tasks: set[str] = set()
    metric_named = spec.metric is not None  # else the first trial's task's headline
    for values in spec.trial_shapes():
        try:
            config = spec.trial_config(values)
            data_key = dataset_key(config)
            datasets[data_key] = prepare_data(config, datasets.get(data_key))
        except ConfigError as error:
            shape = ", ".join(f"{k}={v!r}" for k, v in values.items())
            within = f"sweep file {source}: the trial with {shape} has an invalid run config"
            raise ConfigError(error.key, error.message, within=within, more=error.more) from None
        tasks.add(config.data.task)
        if spec.metric is None:  # the task's headline, with the task's direction
            spec.metric = default_metric(config.data.task)
        if spec.mode is None:
            spec.mode = metric_direction(spec.metric)
        if len(tasks) > 1 and not metric_named:
            raise ConfigError(
                "metric",
                f"the trials learn different tasks ({', '.join(sorted(tasks))}); name the metric to rank them by",
                within=f"sweep file {source}",
            )
        if spec.metric.startswith("personal_") and not config.eval.personalized:
            raise ConfigError(
                "metric",
                f"{spec.metric} needs eval.personalized=true and data.client_test_fraction > 0 in the base config",
                within=f"sweep file {source}",
            )
        if spec.scheduler.type == "asha" and spec.scheduler.grace_period > config.train.rounds:
            raise ConfigError(
                "scheduler.grace_period",
                f"{spec.scheduler.grace_period} must be <= train.rounds ({config.train.rounds})",
                within=f"sweep file {source}",
            )
        interval = spec.scheduler.perturbation_interval
        if spec.scheduler.type == "pbt" and (
            interval >= config.train.rounds or interval % config.checkpoint.every or interval % config.eval.every
        ):
            raise ConfigError(
                "scheduler.perturbation_interval",
                f"{interval} must be < train.rounds "
                f"({config.train.rounds}) and a multiple of checkpoint.every ({config.checkpoint.every}) and of "
                f"eval.every ({config.eval.every}): a trial is cloned from the engine checkpoint of a reported round",
                within=f"sweep file {source}",
            )


def dataset_key(config: RunConfig) -> str:
    """What a trial's dataset (its partition included) depends on: trials with the same key share one."""
    return json.dumps([config.seed, config.data.model_dump(mode="json")], sort_keys=True)


def max_rounds(spec: SweepSpec) -> int:
    """The most rounds any trial runs (ASHA's ``max_t``)."""
    return max(spec.trial_config(values).train.rounds for values in spec.trial_shapes())


def trial_cpus(config: RunConfig, spec: SweepSpec) -> float:
    """CPUs one trial reserves: its driver, its server and its workers."""
    return spec.driver_cpus + config.resources.reserved_cpus
