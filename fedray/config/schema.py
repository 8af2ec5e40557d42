"""Typed run configuration.

A run config is one YAML file with the sections below; every key can be overridden on the command
line with ``--set section.key=value``. Validation happens before Ray starts: an unknown key, a wrong
type or an out-of-range value raises :class:`fedray.config.ConfigError` naming the key and what is
allowed.

The sweep symbols (docs/architecture.md) map to these keys: τ → ``algorithm.tau``, M →
``algorithm.num_neighbors``, β → ``algorithm.beta``, μ → ``algorithm.mu``, α → ``data.alpha``.
Algorithm-specific keys are declared by each algorithm's ``Params`` model (see
:mod:`fedray.algorithms`), not here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from fedray.config.privacy import PrivacyConfig, RobustConfig, privacy_and_robust_problems
from fedray.config.references import is_reference

DATASETS = (
    "digits",
    "mnist",
    "fmnist",
    "cifar10",
    "cifar100",
    "svhn",
    "tinyimagenet",
    "synthetic",
    "imagefolder",
    "table",
    "pystdlib_chars",
    "breast_cancer",
    "wine",
    "diabetes",
)
PARTITIONS = ("iid", "dirichlet", "dirichlet_equal_size", "shards", "quantity", "natural")


class TaskReport(NamedTuple):
    """What a task reports: its headline metric, whether higher is better, and its test metrics."""

    headline: str
    mode: Literal["max", "min"]
    metric_names: tuple[str, ...]


#: The built-in values of ``data.task`` and what each reports (:mod:`fedray.tasks` implements them; kept
#: here, free of torch, for the checks that run before torch is imported, such as a sweep's metric).
TASK_REPORTS = {
    "classification": TaskReport("accuracy", "max", ("accuracy", "loss")),
    "regression": TaskReport("rmse", "min", ("rmse", "mae", "r2", "loss")),
    "multilabel": TaskReport("micro_f1", "max", ("micro_f1", "macro_f1", "map", "loss")),
    "language_modeling": TaskReport("perplexity", "min", ("perplexity", "accuracy", "loss")),
}
TASKS = tuple(TASK_REPORTS)
#: The spread over clients of ``personal_<headline>`` (fedray.runtime.engine), each in the headline's direction.
PERSONAL_SPREAD = ("_worst", "_p10", "_median", "_client_mean")
#: Metrics for which lower is better, besides a task's headline and its personalised variants.
_LOWER_IS_BETTER = ("loss", "_std", "rmse", "mae", "perplexity")


def metric_direction(metric: str) -> Literal["max", "min"]:
    """Whether a larger value of a round row's ``metric`` is better: a task's direction for its headline
    (``test_<headline>``, ``personal_<headline>`` and its worst, p10, median and client mean), else
    ``min`` for losses, spreads, errors and perplexity and ``max`` for the rest."""
    for report in TASK_REPORTS.values():
        personal = f"personal_{report.headline}"
        if metric in (f"test_{report.headline}", personal, *(personal + suffix for suffix in PERSONAL_SPREAD)):
            return report.mode
    return "min" if metric.endswith(_LOWER_IS_BETTER) else "max"


MODELS = ("cnn_small", "cnn_cifar", "resnet8", "resnet10", "resnet18", "mlp", "char_lstm")


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are re-validated, and
    floats must be finite (``.inf``/``nan`` would reach the optimiser or the partitioner) unless a field
    says otherwise; such ±inf values survive ``to_dict()``."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, ser_json_inf_nan="constants")


class SyntheticConfig(Section):
    """Shape of the ``synthetic`` dataset (class-dependent Gaussian patterns; for benchmarks)."""

    num_train: int = Field(10_000, gt=0)
    num_test: int = Field(2_000, gt=0)
    channels: int = Field(1, gt=0, le=64)
    image_size: int = Field(8, gt=0, le=1024)
    num_classes: int = Field(10, ge=2, le=100_000)
    noise: float = Field(0.5, ge=0)


class DataConfig(Section):
    """The ``data`` section. ``name`` is a built-in dataset (:data:`DATASETS`) or
    ``package.module:Name``, a function or class returning :class:`fedray.data.UserData`
    (docs/guide/your_data.md)."""

    name: str = Field("digits", max_length=1000)
    task: str = Field(
        "classification",
        max_length=1000,
        description="what the run learns (fedray.tasks): classification, regression, multilabel, language_modeling "
        "or package.module:Name (a fedray.Task subclass); it sets the loss, the metrics and the headline metric",
    )
    root: str = Field("data", max_length=4096)
    path: str | None = Field(
        None,
        max_length=4096,
        description="imagefolder: the image folder (with train/ and test/ subfolders, or one tree); table: the .parquet or .csv file",
    )
    test_path: str | None = Field(
        None,
        max_length=4096,
        description="imagefolder/table: the test folder or file (default: <path>/test for an image "
        "folder that has one, else a seeded data.test_fraction split)",
    )
    image_size: int | None = Field(
        None, gt=0, le=1024, description="imagefolder/table images: resized to this square size (None: the first image's)"
    )
    label_column: str = Field("label", min_length=1, description="table: the integer label column")
    target_columns: list[str] | None = Field(
        None,
        min_length=1,
        description="table: the target columns of a regression (float, one output each) or of a multilabel task "
        "(0/1, one label each), instead of data.label_column; a single list-valued column holds a vector per row",
    )
    stride: int | None = Field(
        None,
        gt=0,
        le=100_000,
        description="language_modeling: tokens between the starts of two windows of a client's token stream "
        "(None: data.seq_len, windows that do not overlap)",
    )
    tokenizer: str | None = Field(
        None,
        max_length=4096,
        description="a Hugging Face tokenizer directory (save_pretrained) that turns a text column into tokens "
        "(None: characters, or the tokenizer saved with an hf: model)",
    )
    missing: Literal["error", "drop"] = Field(
        "error",
        description="table: a row with a missing value (null or NaN) in a column the run uses is an error naming "
        "the column (error), or is dropped and the drops counted in the log (drop)",
    )
    feature_columns: list[str] | None = Field(None, description="table: the feature columns (None: every other numeric column)")
    image_column: str | None = Field(None, description="table: a column of encoded PNG/JPEG images")
    sequence_column: str | None = Field(None, description="table: a column of token sequences (lists of ints) or of text (characters)")
    client_column: str | None = Field(None, description="table: the client id of every row, for data.partition=natural")
    seq_len: int | None = Field(
        None,
        gt=0,
        le=100_000,
        description="pystdlib_chars: characters per sample (None: 80); table sequences: the length they "
        "are padded to, a longer one is an error (None: the longest); data.task=language_modeling on a table: "
        "the tokens of a window's input (required)",
    )
    max_samples_per_client: int | None = Field(
        None, gt=0, description="data.partition=natural: keep a seeded subset of at most this many samples per client"
    )
    download: bool = False
    num_clients: int = Field(20, gt=0, le=100_000_000, description="data.partition=natural: must equal the number of client ids")
    partition: Literal[PARTITIONS] = "dirichlet"  # type: ignore[valid-type]
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration (symbol α)")
    min_samples_per_client: int = Field(2, ge=1, description="dirichlet: redraw until every client has at least this many samples")
    classes_per_client: int = Field(2, ge=1, description="shards: label classes per client")
    quantity_sigma: float = Field(1.0, gt=0, le=10, description="quantity: sigma of the log-normal client sizes")
    imbalance_ratio: float = Field(1.0, ge=1, le=10_000, description="dirichlet_equal_size: long-tail ratio n_max/n_min (1 = balanced)")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="digits/synthetic: share held out as the global test set")
    client_test_fraction: float = Field(0.0, ge=0, lt=1, description="per-client held-out share for personalised evaluation")
    public_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="share of the training set held out (seeded) before partitioning as an "
        "unlabelled public set disjoint from every client (FederatedDataset.public)",
    )
    max_train_samples: int | None = Field(None, gt=0, description="keep a seeded random subset of this many training samples (None: all)")
    validation_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="hold out this seeded share of the training set and evaluate on it instead of "
        "the test set (tune on it; 0: the test set)",
    )
    augmentation: Literal["auto", "none", "crop_flip"] = "auto"
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)

    _absolute_tokenizer = field_validator("tokenizer")(classmethod(lambda cls, path: _absolute_path(path)))

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        if task not in TASKS and not is_reference(task):
            raise ValueError(f"Input should be {', '.join(repr(known) for known in TASKS)} or package.module:Name (your own task)")
        return task

    @field_validator("name")
    @classmethod
    def _built_in_or_reference(cls, name: str) -> str:
        if name not in DATASETS and not is_reference(name):
            allowed = ", ".join(repr(known) for known in DATASETS)
            raise ValueError(f"Input should be {allowed} or package.module:Name (your own data)")
        return name


TORCHVISION_PREFIX = "torchvision:"
HF_PREFIX = "hf:"
#: Files of a tokenizer saved with save_pretrained: an hf: model directory holding one tokenizes a text column.
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class AdaptersConfig(Section):
    """``model.adapters``: parameter-efficient fine-tuning of an ``hf:`` model with Hugging Face ``peft``.
    Only the adapters are trained, broadcast and uploaded (docs/guide/your_model.md)."""

    method: Literal["none", "lora"] = Field("none", description="lora: low-rank adapters (Hu et al., ICLR 2022)")
    rank: int = Field(8, gt=0, le=4096, description="lora: the rank r of each adapter")
    alpha: float = Field(16.0, gt=0, description="lora: the scaling numerator (updates are scaled by alpha / rank)")
    dropout: float = Field(0.0, ge=0, lt=1, description="lora: dropout on the adapters' input")
    target_modules: list[str] | None = Field(
        None, description="lora: names (or name suffixes) of the modules that get adapters (None: peft's default for the architecture)"
    )


class ModelConfig(Section):
    """``model.name`` is a built-in name (:data:`MODELS`), ``torchvision:NAME`` (a torchvision
    classification model, untrained) or ``package.module:Name`` (the user's ``nn.Module`` class or
    factory); :mod:`fedray.models.external` builds the last two (docs/guide/your_model.md)."""

    name: str = Field(
        "cnn_small", description="a built-in model, torchvision:NAME, hf:<directory saved with save_pretrained> or package.module:Name"
    )
    norm: Literal["batch", "group"] = "batch"
    projection_dim: int | None = Field(None, gt=0, description="output size of the optional projection head (None: no head)")
    width: int = Field(16, gt=0, le=1024, description="channels of the first conv layer (CNNs)")
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="torchvision:/package.module:Name models: extra keyword arguments of the class or factory",
    )
    classifier: str | None = Field(
        None,
        description="package.module:Name / torchvision: models: the submodule that maps features to logits "
        "(default: the module's last nn.Linear)",
    )
    init: str | None = Field(
        None,
        max_length=4096,
        description="a state_dict file (torch.save) the model starts from, made absolute against the "
        "current directory (None: random initialisation)",
    )
    init_strict: bool = Field(
        True,
        description="model.init: every key of the model and of the file must match (true), or the keys whose names "
        "and shapes match are loaded and every other one is listed once (false: a pretrained backbone with a new head)",
    )
    freeze: list[str] = Field(
        default_factory=list,
        description="parameter name prefixes kept at their initial (model.init) values: not trained, not broadcast, not uploaded",
    )
    adapters: AdaptersConfig = Field(default_factory=lambda: AdaptersConfig())

    @field_validator("name")
    @classmethod
    def _known_model(cls, name: str) -> str:
        if name.startswith(HF_PREFIX):  # Ray actors run elsewhere than the caller's directory: pin a relative path to it
            directory = Path(name.removeprefix(HF_PREFIX)).expanduser()
            return HF_PREFIX + str(directory.absolute()) if directory.exists() else name
        if name in MODELS or is_reference(name):
            return name
        raise ValueError(
            f"unknown model; choose one of {', '.join(MODELS)}, {TORCHVISION_PREFIX}NAME, {HF_PREFIX}<directory> or package.module:Name"
        )

    @field_validator("init")
    @classmethod
    def _absolute_init(cls, init: str | None) -> str | None:
        """Ray actors run elsewhere than the caller's directory: pin a relative path to it."""
        return None if init is None else str(Path(init).expanduser().absolute())

    @field_validator("kwargs", "classifier")
    @classmethod
    def _only_for_external_models(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.data.get("name", "")
        if value and not is_reference(name):
            raise ValueError(f"applies to torchvision:NAME and package.module:Name models, not the built-in {name!r}")
        return value


class AlgorithmConfig(BaseModel):
    """``algorithm.name`` plus that algorithm's hyperparameters.

    ``name`` is a built-in or installed algorithm name, or ``package.module:ClassName`` (user code).
    The extra keys are validated by the named algorithm's ``Params`` model in
    :func:`fedray.algorithms.validate_algorithm_params`.
    """

    model_config = ConfigDict(extra="allow")

    name: str = "fedavg"


class TrainConfig(Section):
    rounds: int = Field(30, gt=0)
    clients_per_round: int = Field(10, gt=0)
    local_epochs: int = Field(2, gt=0)
    batch_size: int = Field(16, gt=0)
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    lr_decay: float = Field(1.0, gt=0, le=1, description="learning rate × lr_decay^(round-1)")
    grad_clip: float | None = Field(None, gt=0, description="max gradient norm (None: no clip)")
    loss: Literal["auto", "mse", "mae", "huber"] = Field(
        "auto", description="the task's base loss: auto (the task's own), or for data.task=regression mse, mae or huber"
    )
    huber_delta: float = Field(
        1.0, gt=0, description="train.loss=huber: where the loss turns from quadratic to linear (standardised units)"
    )
    vectorize: Literal["auto", "on", "off"] = Field(
        "off",
        description="train a worker's clients that share an architecture as one batched computation (torch.func.vmap): "
        "on (refused where the algorithm or model cannot), auto (where they can, else the loop), off (one client after another)",
    )
    mode: Literal["sync", "async"] = Field(
        "sync",
        description="sync: rounds of train.clients_per_round clients; async: buffered asynchronous aggregation (FedBuff) "
        "on the simulated clock, systems.fedbuff",
    )


class EvalConfig(Section):
    every: int = Field(1, gt=0, description="evaluate every this many rounds (and the last)")
    batch_size: int = Field(512, gt=0)
    personalized: bool = Field(False, description="also evaluate every client on its own held-out split")


class CheckpointConfig(Section):
    every: int = Field(5, gt=0, description="write a checkpoint every this many rounds")
    keep: int = Field(2, gt=0, description="number of most recent checkpoints kept")


class ResourcesConfig(Section):
    backend: Literal["auto", "local", "ray"] = Field(
        "auto",
        description="where the workers run: local (in the driver process, no Ray: starts at once, "
        "breakpoint() works in client code), ray (worker actors on a Ray cluster: parallel workers, "
        "fractional GPUs, replacement of dead workers), auto (local when num_workers is 1 and no Ray "
        "address is given, else ray); fedray tune always runs its trials on ray",
    )
    num_workers: int = Field(2, gt=0)
    cpus_per_worker: float = Field(1.0, gt=0)
    gpus_per_worker: float = Field(0.0, ge=0, le=1)
    server_cpus: float = Field(0.0, ge=0, description="CPUs reserved for the server actor")
    vectorize_group: int | None = Field(
        None, gt=0, le=100_000, description="train.vectorize: clients trained together at most (None: sized from the device's free memory)"
    )
    max_worker_restarts: int = Field(3, ge=0, description="times a dead worker actor is replaced before the run fails")
    placement_strategy: Literal["PACK", "SPREAD"] = Field(
        "PACK",
        description="placement-group strategy of the worker bundles: PACK fills as few nodes as "
        "possible, SPREAD places them on distinct nodes where it can (multi-node clusters)",
    )

    @property
    def reserved_cpus(self) -> float:
        """CPUs a run reserves: its server's and its workers'."""
        return self.server_cpus + self.num_workers * self.cpus_per_worker


class OutputConfig(Section):
    dir: str = Field("runs", min_length=1, max_length=4096)
    name: str | None = Field(None, description="run directory name (default: algorithm-dataset-time)")
    staging_dir: str | None = Field(
        None,
        description="local directory a run writes to when output.dir is a URI (s3://, gs://, "
        "file://...) and copies to it after every checkpoint and at the end (default: "
        "<system temp dir>/fedray-staging)",
    )
    client_state_dir: str | None = Field(
        None,
        description="where algorithms with per-client state keep it, as <client_state_dir>/<run name>: "
        "a path every node mounts at the same place or a URI (s3://, gs://, hdfs://) (default: "
        "<output.dir>/<run name>/client_state, written straight to output.dir when it is a URI)",
    )
    tensorboard: bool = True
    plots: bool = True
    record_update_hashes: bool = Field(
        False,
        description="record a hash of every client's upload in its client row (update_hash), which fedray replay checks a "
        "re-executed client update against",
    )
    callbacks: list[str] = Field(
        default_factory=list,
        description="extra run callbacks: package.module:ClassName (a fedray.Callback subclass built "
        "without arguments) or a built-in name (mlflow)",
    )

    @field_validator("name")
    @classmethod
    def _name_stays_inside_dir(cls, name: str | None) -> str | None:
        """The run directory is ``output.dir/output.name``: a name must not lead anywhere else."""
        if name is None:
            return None
        if name in ("", ".", "..") or any(sep in name for sep in ("/", "\\", "\0")) or len(name) > 200:
            raise ValueError("must be a plain directory name inside output.dir (no '/', '\\', '..'; at most 200 characters)")
        return name


class LogNormalConfig(Section):
    """A quantity that varies over clients: log-normal with this median and σ of its logarithm
    (σ = 0: every client has the median)."""

    median: float = Field(gt=0)
    sigma: float = Field(0.0, ge=0, le=5)


def _absolute_path(path: str | None) -> str | None:
    """The server actor runs elsewhere than the caller's directory: pin a relative path to it."""
    return None if path is None else str(Path(path).expanduser().absolute())


class DevicesConfig(Section):
    """``systems.devices``: each client's training speed and bandwidth (docs/guide/systems.md)."""

    source: Literal["distribution", "profiles", "file"] = Field(
        "distribution",
        description="distribution: drawn per client from the three log-normals below; profiles: each client "
        "one of the named device profiles, drawn with the shares of `profiles`; file: one row per client id in `file`",
    )
    flops_per_second: LogNormalConfig = Field(
        default_factory=lambda: LogNormalConfig(median=2e10, sigma=0.7), description="training throughput, FLOP/s"
    )
    download_mbps: LogNormalConfig = Field(default_factory=lambda: LogNormalConfig(median=20.0, sigma=0.8))
    upload_mbps: LogNormalConfig = Field(default_factory=lambda: LogNormalConfig(median=5.0, sigma=0.8))
    profiles: dict[str, float] = Field(
        default_factory=dict, description="source=profiles: device profile name -> share of the clients (shares are normalised)"
    )
    file: str | None = Field(
        None,
        max_length=4096,
        description="source=file: a .csv or .parquet with columns client_id, flops_per_second, download_mbps, upload_mbps",
    )

    _absolute_file = field_validator("file")(classmethod(lambda cls, path: _absolute_path(path)))

    @field_validator("profiles")
    @classmethod
    def _positive_shares(cls, profiles: dict[str, float]) -> dict[str, float]:
        if any(not share > 0 for share in profiles.values()):
            raise ValueError("every share must be > 0")
        return profiles

    @model_validator(mode="after")
    def _source_has_its_input(self) -> "DevicesConfig":
        if self.source == "profiles" and not self.profiles:
            raise ValueError("source=profiles needs systems.devices.profiles (name: share)")
        if self.source == "file" and self.file is None:
            raise ValueError("source=file needs systems.devices.file")
        return self


class AvailabilityConfig(Section):
    """``systems.availability``: which clients are online when a round starts (docs/guide/systems.md)."""

    process: Literal["always", "bernoulli", "diurnal", "trace"] = Field(
        "always",
        description="always; bernoulli: online with `probability` each round; diurnal: with a probability that "
        "follows each client's time of day; trace: the online intervals of `trace_file`",
    )
    probability: float = Field(0.8, gt=0, le=1, description="bernoulli: P(online) per round; diurnal: its daily mean")
    diurnal_amplitude: float = Field(0.5, ge=0, le=1, description="diurnal: relative swing of P(online) over a day")
    day_seconds: float = Field(86_400.0, gt=0, description="diurnal: the period of the daily pattern, simulated seconds")
    trace_file: str | None = Field(
        None, max_length=4096, description="trace: a .csv or .parquet of online intervals: client_id, start, end (simulated seconds)"
    )
    trace_period_seconds: float | None = Field(
        None, gt=0, description="trace: the trace repeats with this period (None: after its last interval a client stays offline)"
    )

    _absolute_trace = field_validator("trace_file")(classmethod(lambda cls, path: _absolute_path(path)))

    @model_validator(mode="after")
    def _trace_has_a_file(self) -> "AvailabilityConfig":
        if self.process == "trace" and self.trace_file is None:
            raise ValueError("process=trace needs systems.availability.trace_file")
        return self


class SelectionConfig(Section):
    """``systems.selection``: over-selection, the reporting deadline and dropouts (Bonawitz et al. 2019).
    ``train.clients_per_round`` is the target K: the first K clients to finish are aggregated."""

    over_selection: float = Field(1.0, ge=1, le=100, description="select ceil(over_selection × train.clients_per_round) available clients")
    deadline_seconds: float | None = Field(
        None, gt=0, description="clients that would finish later than this after the round starts are late (None: no deadline)"
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="probability that a selected client drops out during the round")
    empty_round_seconds: float = Field(
        60.0, gt=0, description="how far the clock moves in a round in which no client is online (without a deadline)"
    )


class CompressionConfig(Section):
    """``systems.compression``: what a client's model-weight update is compressed to before it is
    uploaded (:mod:`fedray.systems.compression`; docs/guide/systems.md, "Compression")."""

    method: Literal["none", "fp16", "int8", "topk"] = Field(
        "none",
        description="none; fp16: half precision; int8: unbiased stochastic quantisation to 8 bits with a scale per "
        "bucket (QSGD); topk: the topk_fraction largest entries by magnitude and their indices",
    )
    topk_fraction: float = Field(0.01, gt=0, le=1, description="topk: share of the update's entries kept (at least one)")
    bucket_size: int = Field(1024, gt=0, le=1 << 24, description="int8: entries sharing one float32 scale")
    error_feedback: bool = Field(
        False,
        description="add what compression left out of a client's last upload to its next one (the residual is client "
        "state; Stich et al. 2018, Karimireddy et al. 2019)",
    )

    @model_validator(mode="after")
    def _error_feedback_needs_a_method(self) -> "CompressionConfig":
        if self.error_feedback and self.method == "none":
            raise ValueError("error_feedback needs a compression method (systems.compression.method: fp16, int8 or topk)")
        return self


class FedBuffConfig(Section):
    """``systems.fedbuff``: buffered asynchronous aggregation, ``train.mode: async`` (Nguyen et al.,
    AISTATS 2022; :mod:`fedray.systems.fedbuff`, docs/guide/systems.md)."""

    concurrency: int | None = Field(None, gt=0, description="clients training at once (null: train.clients_per_round)")
    buffer_size: int = Field(5, gt=0, description="client updates the server aggregates at once, K (at most the concurrency)")
    staleness_exponent: float = Field(
        0.5, ge=0, le=10, description="an update τ versions old is weighted (1 + τ)^-exponent (0.5: FedBuff's 1/√(1+τ); 0: no discount)"
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="an update more than this many versions old is discarded on arrival, counted as late, and does not fill the "
        "buffer (SAFA's lag tolerance; null: every update is aggregated)",
    )
    mixing: Literal["delta", "model"] = Field(
        "delta",
        description="delta: a client's update is its change from the version it started from (FedBuff); model: the server mixes the "
        "client's model into the current one, w + s(τ)·(w_k − w) (FedAsync, Xie et al. 2019, with buffer_size 1)",
    )

    def concurrency_for(self, clients_per_round: int) -> int:
        """The concurrency C of a run with ``train.clients_per_round`` = ``clients_per_round``."""
        return self.concurrency if self.concurrency is not None else clients_per_round


class SystemsConfig(Section):
    """``systems``: the simulated devices, their availability and the simulated clock. Off by default;
    off, a run computes exactly what it did without this section (docs/guide/systems.md)."""

    enabled: bool = False
    train_flops_per_forward: float = Field(
        3.0, ge=1, description="training FLOPs per sample as a multiple of the forward pass (forward + backward ≈ 3)"
    )
    devices: DevicesConfig = Field(default_factory=DevicesConfig)
    availability: AvailabilityConfig = Field(default_factory=AvailabilityConfig)
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    compression: CompressionConfig = Field(default_factory=CompressionConfig)
    fedbuff: FedBuffConfig = Field(default_factory=FedBuffConfig)

    @model_validator(mode="after")
    def _set_only_when_enabled(self) -> "SystemsConfig":
        # compared with the defaults, not with the keys given: a saved config.yaml spells every key out
        defaults = SystemsConfig.model_construct().model_dump(exclude={"enabled"})  # model_construct: no validation, no recursion
        if not self.enabled and self.model_dump(exclude={"enabled"}) != defaults:
            raise ValueError("systems keys are set but systems.enabled is false; set systems.enabled=true to use them")
        return self


class RunConfig(Section):
    """A whole run config: one attribute per YAML section (``config.data.alpha``, ``config.train.rounds``)."""

    seed: int = Field(0, ge=0, lt=2**32, description="every random choice derives from it")
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    systems: SystemsConfig = Field(default_factory=SystemsConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    robust: RobustConfig = Field(default_factory=RobustConfig)

    @model_validator(mode="after")
    def _cross_field_checks(self) -> "RunConfig":
        if self.train.clients_per_round > self.data.num_clients:
            raise ValueError(
                f"train.clients_per_round ({self.train.clients_per_round}) must be <= data.num_clients ({self.data.num_clients})"
            )
        if self.train.loss != "auto" and self.data.task != "regression":
            raise ValueError(f"train.loss={self.train.loss} applies to data.task=regression; data.task={self.data.task} has its own loss")
        if self.model.adapters.method != "none" and not self.model.name.startswith(HF_PREFIX):
            raise ValueError(f"model.adapters applies to Hugging Face models (model.name: {HF_PREFIX}<path>), not {self.model.name!r}")
        if self.data.tokenizer is None and self.data.sequence_column is not None and self.model.name.startswith(HF_PREFIX):
            directory = Path(self.model.name.removeprefix(HF_PREFIX))
            if any((directory / name).is_file() for name in HF_TOKENIZER_FILES):  # the model's own tokenizer reads its text
                self.data.tokenizer = str(directory)
        if self.eval.personalized and self.data.client_test_fraction == 0:
            raise ValueError("eval.personalized needs data.client_test_fraction > 0 (each client's held-out split)")
        return self

    @model_validator(mode="after")
    def _checks_across_sections(self) -> "RunConfig":
        """train.mode's, privacy's and robust's problems with the other sections, all in one message
        (ConfigError.detail's layout: one problem a line), so that a config with several is refused once."""
        problems = async_mode_problems(self) + privacy_and_robust_problems(self)
        if problems:
            raise ValueError("\n  ".join(problems))
        return self

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON-able values; the ``systems``, ``privacy`` and ``robust`` sections only when
        they are enabled, so that a run without them saves, checkpoints and logs exactly the config it
        did before the sections existed."""
        off: dict[str, Any] = {name: True for name in ("systems", "privacy", "robust") if not getattr(self, name).enabled}
        if self.privacy.secure_aggregation.enabled:  # secure aggregation without DP saves the section too
            off.pop("privacy", None)
        if self.train.mode == "sync":  # nor train.mode and systems.fedbuff, whose keys are then at their defaults
            off["train"] = {"mode"}
            off.setdefault("systems", {"fedbuff"})
        for section, keys in _KEYS_SAVED_WHEN_SET.items():  # left out at their defaults, as the sections above
            default = type(getattr(self, section))()
            unset = {key for key in keys if getattr(getattr(self, section), key) == getattr(default, key)}
            if unset and off.get(section) is not True:
                off[section] = set(off.get(section, set())) | unset
        return self.model_dump(mode="json", exclude=off)


#: Keys added with tasks, pretrained models, vectorised training, replay, the privacy audit and the
#: attack presets: left out of a saved config while at their defaults, so that a run that uses none of
#: them saves and checkpoints exactly the config it did before they existed.
_KEYS_SAVED_WHEN_SET = {
    "data": ("task", "target_columns", "stride", "tokenizer", "missing"),
    "train": ("loss", "huber_delta", "vectorize"),
    "resources": ("vectorize_group",),
    "output": ("record_update_hashes",),
    "privacy": ("audit", "secure_aggregation"),
    "robust": ("attackers", "attackers_per_round", "alie_z", "trigger_size", "poison_fraction", "target_class", "boost"),
    "model": ("init_strict", "freeze", "adapters"),
}


def async_mode_problems(config: RunConfig) -> list[str]:
    """``train.mode`` against the sections it needs and excludes, one line each: checked by ``RunConfig``'s
    validator. Whether the algorithm's aggregation allows it is checked with the algorithm
    (:func:`fedray.systems.fedbuff.check_fedbuff`); the ``privacy`` keys it refuses, by
    :func:`fedray.config.privacy.async_privacy_problems`."""
    systems, fedbuff = config.systems, config.systems.fedbuff
    if config.train.mode == "sync":
        return (
            ["systems.fedbuff keys are set but train.mode is sync; set train.mode=async to use them"] if fedbuff != FedBuffConfig() else []
        )
    if not systems.enabled:
        return ["train.mode=async trains clients on the simulated clock; set systems.enabled=true"]
    problems = []
    concurrency = fedbuff.concurrency_for(config.train.clients_per_round)
    if concurrency > config.data.num_clients:
        problems.append(
            f"systems.fedbuff.concurrency ({concurrency}) must be <= data.num_clients ({config.data.num_clients}): "
            "a client trains one update at a time"
        )
    if fedbuff.buffer_size > concurrency:
        source = "systems.fedbuff.concurrency" if fedbuff.concurrency is not None else "train.clients_per_round"
        problems.append(
            f"systems.fedbuff.buffer_size ({fedbuff.buffer_size}) must be <= the concurrency ({concurrency}, {source}): "
            "the server would wait for more updates than there are clients training"
        )
    if systems.selection.over_selection != 1 or systems.selection.deadline_seconds is not None:
        problems.append(
            "systems.selection.over_selection and deadline_seconds close synchronous rounds, which train.mode=async has none of "
            "(systems.fedbuff.concurrency bounds the clients training at once); leave them at their defaults"
        )
    return problems
