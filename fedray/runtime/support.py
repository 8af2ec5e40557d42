"""Which feature works with which algorithm: the support matrix (docs/support_matrix.md, ``fedray
algorithms --matrix``), computed by the checks every run passes before Ray starts, so that the page
and the code cannot disagree.

A cell is one tiny run config: the algorithm's base config (:func:`base_overrides`: its defaults on
the embedded digits data, 10 clients, 2 a round, one round, model ``mlp``, and what the algorithm's
``requires`` asks for, :data:`MEETS`) with the keys of one feature (:data:`FEATURES`). What ``fedray
run`` decides about that config before Ray starts is the cell:

- **refused** (✗): validating the config (:func:`fedray.plugins.load_config`: the schema, with its
  checks across sections such as :func:`fedray.config.privacy.privacy_and_robust_problems`, and the
  algorithm's own keys) or :func:`fedray.runtime.experiment.prepare_data` (the data, the model,
  :func:`fedray.algorithms.requirements.check_requirements` with the upload, compression and
  asynchronous checks, the systems model, privacy's calibration) raises a
  :class:`~fedray.config.ConfigError`; its problems are the reasons. Where the refusal only asks
  for a key of the feature's own (a privacy bound of an upload kind, ``privacy.sampling``), the key
  is added (:attr:`Feature.completions`) and the config checked again: the cell says that it needs
  the key, or is refused for the problems that remain;
- **supported with a deviation** (~): accepted, and the code declares that the feature changes what
  the algorithm does or leaves part of it out (:attr:`Feature.deviation`: keys sent as constants under privacy,
  :func:`fedray.algorithms.uploads.privacy_deviation`; a setting with no effect);
- **supported** (✓): accepted as it is.

The task columns come from the algorithm's task requirements
(:func:`fedray.algorithms.requirements.supported_tasks`, the declarations ``check_requirements``
reads), with the requirement's message as the reason.

``python -m fedray.runtime.support --markdown > docs/support_matrix.md`` writes the page
(``tests/runtime/test_support_matrix.py`` fails when the committed page differs from it).
"""

from __future__ import annotations

import argparse
import logging
import sys
import typing
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Literal

from fedray.algorithms.requirements import (
    BATCHNORM,
    FEATURE_TAPS,
    IMAGES,
    PERSONAL_TEST_SPLITS,
    PROJECTION_HEAD,
    TASK_REQUIREMENTS,
    Requirement,
    is_personalised,
    supported_tasks,
)
from fedray.algorithms import ALGORITHMS, Algorithm, get_algorithm_class
from fedray.algorithms.ssl import SiameseAlgorithm
from fedray.algorithms.uploads import attack_deviation, privacy_deviation
from fedray.config import ConfigError, RunConfig
from fedray.config.privacy import RobustConfig
from fedray.config.schema import CompressionConfig
from fedray.data import FederatedDataset, build_federated_dataset
from fedray.plugins import load_config
from fedray.runtime.experiment import prepare_data
from fedray.systems.compression import keeps_client_state
from fedray.tasks import TASKS

Status = Literal["supported", "deviates", "refused"]
SUPPORTED: Status = "supported"
DEVIATES: Status = "deviates"
REFUSED: Status = "refused"
SYMBOLS: dict[Status, str] = {SUPPORTED: "✓", DEVIATES: "~", REFUSED: "✗"}
LEGEND = "✓ supported · ~ supported, with the deviation stated · ✗ refused before the run starts (exit code 2), with the reason"

#: Every cell's config starts from these keys (then the algorithm's :data:`MEETS`, then the feature's).
BASE = (
    "data.name=digits",
    "data.num_clients=10",
    "train.clients_per_round=2",
    "train.rounds=1",
    "train.local_epochs=1",
    "model.name=mlp",
)
#: The keys that meet each requirement an algorithm may declare, added to its base config (a task
#: requirement is met by digits' classification, the base's task).
MEETS: dict[Requirement, tuple[str, ...]] = {
    BATCHNORM: ("model.name=resnet8", "model.norm=batch"),
    FEATURE_TAPS: ("model.name=cnn_small",),
    IMAGES: ("model.name=cnn_small",),  # augmented views of images, and encoders with convolutions
    PROJECTION_HEAD: ("model.projection_dim=32",),
    PERSONAL_TEST_SPLITS: ("data.client_test_fraction=0.25", "eval.personalized=true"),
}
#: Narrow Siamese heads for the self-supervised algorithms (their defaults, 4096 wide, cost a tenth of a
#: second to build each time a cell's model is built, and seconds a run when a cell is walked).
SIAMESE_HEADS = ("algorithm.hidden_dim=64", "algorithm.projection_dim=32")
#: Where the client-state column puts the client state (nothing is contacted before Ray starts).
STATE_URI = "s3://fedray-state/support-matrix"

Deviation = Callable[[RunConfig, "Algorithm", "FederatedDataset"], "str | None"]


def _privacy_deviation(config: RunConfig, algorithm: Algorithm, data: FederatedDataset) -> str | None:

    return privacy_deviation(algorithm)


def _attack_deviation(config: RunConfig, algorithm: Algorithm, data: FederatedDataset) -> str | None:
    return attack_deviation(algorithm)


def _personal_evaluation_deviation(config: RunConfig, algorithm: Algorithm, data: FederatedDataset) -> str | None:
    if algorithm.evaluation_clients(data.num_clients) is None:
        return None
    return (
        f"eval.personalized has no effect: {algorithm.name} evaluates clients of its own on the test set "
        "(Algorithm.evaluation_clients), and the server then reports no personal_* metrics"
    )


def _client_state_deviation(config: RunConfig, algorithm: Algorithm, data: FederatedDataset) -> str | None:

    if keeps_client_state(config, type(algorithm)):
        return None
    return f"no effect: {algorithm.name} keeps no client state, so nothing is stored there"


def _personal_evaluation_note(config: RunConfig, algorithm: Algorithm, data: FederatedDataset) -> str | None:
    if is_personalised(type(algorithm)):
        return f"required: {algorithm.name} is evaluated by each client's own model on its held-out split"
    return "the global model, evaluated on each client's held-out split"


@dataclass(frozen=True)
class Feature:
    """One column: the keys a cell adds to the algorithm's base config."""

    key: str
    header: str  # the column's heading in the tables
    title: str  # what the page's list of columns calls it
    overrides: tuple[str, ...] = ()
    #: ``key=value`` settings of the feature's own added when a refusal names their key (and only that)
    completions: tuple[str, ...] = ()
    task: str | None = None  # a task column: from the algorithm's task requirements
    deviation: Deviation | None = None  # what the code says the feature changes for an algorithm it accepts
    note: Deviation | None = None  # what a supported cell adds, not a deviation


_SYSTEMS = "systems.enabled=true"
_ASYNC = (_SYSTEMS, "train.mode=async", "systems.fedbuff.buffer_size=2")
_DP_COMPLETIONS = ("privacy.clip_prototypes=1.0", "privacy.clip_logits=1.0", "privacy.clip_counts=1.0", "privacy.clip_controls=1.0")
_ROBUST_COHORT = "train.clients_per_round=7"  # Bulyan's 4f + 3 with f = 1 (Krum's 2f + 3): the same cohort for every rule

#: Column headings (the rest are the names themselves) and the keys a rule needs beyond ``robust.rule``
#: to act on that cohort (a trimmed mean cuts ⌊β·7⌋ = 1 update at each end).
_HEADERS = {"classification": "cls", "regression": "reg", "multilabel": "mlab", "language_modeling": "lm"}
_HEADERS |= {"median": "med", "trimmed_mean": "trim", "multi_krum": "mkrum"}
_HEADERS |= {"scaled": "scal", "random": "rand", "label_flip": "lflip", "backdoor": "bkdr"}
_RULE_KEYS = {"trimmed_mean": ("robust.trim_fraction=0.2",)}
_METHOD_TITLES = {"int8": "int8 (QSGD)", "topk": "top-k (1 %)"}


def _compression(method: str, *extra: str) -> tuple[str, ...]:
    return (_SYSTEMS, f"systems.compression.method={method}", *extra)


def _choices(model: type, field_name: str) -> tuple[str, ...]:
    """The values a ``Literal`` config field allows but ``none``: the built-in methods, rules..."""
    return tuple(value for value in typing.get_args(model.model_fields[field_name].annotation) if value != "none")


def _columns() -> tuple[Feature, ...]:
    """One column per built-in task, compression method (and top-k with error feedback), robust rule and
    attack, as the schema and :data:`fedray.tasks.TASKS` list them, and the other features."""

    tasks = [Feature(task, _HEADERS.get(task, task), f"data.task: {task}", task=task) for task in TASKS]
    compression = [
        Feature(method, method, f"compression: {_METHOD_TITLES.get(method, method)}", _compression(method))
        for method in _choices(CompressionConfig, "method")
    ]
    compression.append(
        Feature(
            "topk_ef",
            "topk+ef",
            "compression: top-k with error feedback",
            _compression("topk", "systems.compression.error_feedback=true"),
        )
    )
    rules = [
        Feature(rule, _HEADERS.get(rule, rule), f"robust.rule: {rule}", (f"robust.rule={rule}", *_RULE_KEYS.get(rule, ()), _ROBUST_COHORT))
        for rule in _choices(RobustConfig, "rule")
    ]
    attacks = [
        Feature(
            f"attack_{attack}",
            _HEADERS.get(attack, attack),
            f"attack: {attack}",
            ("robust.malicious_fraction=0.3", f"robust.attack={attack}", _ROBUST_COHORT),
            deviation=_attack_deviation,
        )
        for attack in _choices(RobustConfig, "attack")
        if attack != RobustConfig().attack  # the default attack is the attackers column
    ]
    return (
        *tasks,
        Feature("systems", "sys", "systems model (device speeds, simulated clock, bytes)", (_SYSTEMS,)),
        Feature("async", "async", "train.mode: async (FedBuff)", _ASYNC),
        Feature(
            "async_central_dp",
            "async+cdp",
            "train.mode: async with central DP (noise on each buffer's sum, accounted at q = 1)",
            (*_ASYNC, "privacy.mechanism=central", "privacy.noise_multiplier=1.0"),
            completions=_DP_COMPLETIONS,
            deviation=_privacy_deviation,
        ),
        Feature(
            "async_local_dp",
            "async+ldp",
            "train.mode: async with local DP",
            (*_ASYNC, "privacy.mechanism=local", "privacy.noise_multiplier=1.0"),
            completions=_DP_COMPLETIONS,
            deviation=_privacy_deviation,
        ),
        Feature(
            "async_median", "async+med", "train.mode: async with robust.rule: median over each buffer", (*_ASYNC, "robust.rule=median")
        ),
        Feature(
            "async_attackers",
            "async+atk",
            "train.mode: async with attackers (robust.malicious_fraction, sign_flip)",
            (*_ASYNC, "robust.malicious_fraction=0.3"),
        ),
        *compression,
        Feature(
            "central_dp",
            "cdp",
            "central DP (DP-FedAvg)",
            ("privacy.mechanism=central", "privacy.noise_multiplier=1.0"),
            completions=(*_DP_COMPLETIONS, "privacy.sampling=fixed_size"),
            deviation=_privacy_deviation,
        ),
        Feature(
            "local_dp",
            "ldp",
            "local DP",
            ("privacy.mechanism=local", "privacy.noise_multiplier=1.0"),
            completions=_DP_COMPLETIONS,
            deviation=_privacy_deviation,
        ),
        Feature(
            "secagg",
            "sa",
            "secure aggregation, simulated (privacy.secure_aggregation)",
            ("privacy.secure_aggregation.enabled=true",),
        ),
        *rules,
        Feature(
            "attackers",
            "atk",
            "attackers (robust.malicious_fraction, sign_flip)",
            ("robust.malicious_fraction=0.3", _ROBUST_COHORT),
            deviation=_attack_deviation,
        ),
        *attacks,
        Feature(
            "attackers_per_round",
            "atk/rd",
            "attackers: exactly k a round (robust.attackers: per_round)",
            ("robust.attackers=per_round", "robust.attackers_per_round=2", _ROBUST_COHORT),
            deviation=_attack_deviation,
        ),
        Feature(
            "personalised",
            "pers",
            "personalised evaluation (eval.personalized)",
            ("data.client_test_fraction=0.25", "eval.personalized=true"),
            deviation=_personal_evaluation_deviation,
            note=_personal_evaluation_note,
        ),
        Feature(
            "s3_state",
            "s3",
            "client state on S3 (output.client_state_dir)",
            (f"output.client_state_dir={STATE_URI}",),
            deviation=_client_state_deviation,
        ),
    )


#: The columns, in order.
FEATURES: tuple[Feature, ...] = _columns()
FEATURE_KEYS = {feature.key: feature for feature in FEATURES}


@dataclass(frozen=True)
class Cell:
    """One algorithm with one feature: its status, its notes (the reasons of a refusal, the deviation,
    what it needs) and the overrides of the config that was checked (the one ``fedray run`` would run)."""

    status: Status
    notes: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()

    @property
    def symbol(self) -> str:
        return SYMBOLS[self.status]


@dataclass
class SupportMatrix:
    """Every cell of some algorithms (rows, in the order given) with :data:`FEATURES` (columns)."""

    algorithms: list[str]
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)

    def cell(self, algorithm: str, feature: str) -> Cell:
        return self.cells[algorithm, feature]


def base_overrides(algorithm: type[Algorithm], name: str) -> tuple[str, ...]:
    """The overrides of ``algorithm``'s base config: :data:`BASE`, ``algorithm.name`` and the keys of
    :data:`MEETS` for each requirement it declares, and :data:`SIAMESE_HEADS` for a self-supervised one
    (later keys win)."""
    needed = [key for requirement, keys in MEETS.items() if requirement in algorithm.requires for key in keys]
    heads = SIAMESE_HEADS if issubclass(algorithm, SiameseAlgorithm) else ()
    return (*BASE, f"algorithm.name={name}", *needed, *heads)


class _Checker:
    """The checks of ``fedray run`` before Ray starts, on one config at a time; the partitioned data
    is kept per data section (partitioning is what it would repeat)."""

    def __init__(self) -> None:
        self.datasets: dict[str, FederatedDataset] = {}

    def check(self, overrides: Iterable[str]) -> tuple[RunConfig, FederatedDataset]:
        """The validated config and its data; raises :class:`ConfigError` as ``fedray run`` would."""

        config = load_config(None, list(overrides))
        key = f"{config.seed}:{config.data.model_dump_json()}"
        self.datasets[key] = prepare_data(config, self.datasets.get(key))
        return config, self.datasets[key]

    def data(self, config: RunConfig) -> FederatedDataset:
        """The base's data (digits, as :data:`BASE` has it) whatever ``config``'s task."""

        data_config = config.data.model_copy(update={"task": "classification"})
        key = f"{config.seed}:{data_config.model_dump_json()}"
        if key not in self.datasets:
            self.datasets[key] = build_federated_dataset(data_config, config.seed)
        return self.datasets[key]


def _problems(error: ConfigError) -> list[tuple[str | None, str]]:
    return [(error.key, error.message), *error.more]


def _line(key: str | None, message: str) -> str:
    return message if key is None else f"{key}: {message}"


def _task_cell(checker: _Checker, algorithm: type[Algorithm], name: str, task: str) -> Cell:

    overrides = (*BASE, f"algorithm.name={name}", f"data.task={task}")
    if task in supported_tasks(algorithm):
        return Cell(SUPPORTED, (), overrides)
    config = load_config(None, overrides)
    unmet = [r for r, attribute in TASK_REQUIREMENTS.items() if r in algorithm.requires and not getattr(TASKS[task], attribute)]
    info = checker.data(config).info  # the base's data: the task requirements' messages name the task, not the data
    return Cell(REFUSED, tuple(_line(r.keys, r.message(name, config, info)) for r in unmet), overrides)


def _feature_cell(checker: _Checker, algorithm: type[Algorithm], name: str, feature: Feature) -> Cell:
    overrides = [*base_overrides(algorithm, name), *feature.overrides]
    notes: list[str] = []
    while True:
        try:
            config, data = checker.check(overrides)
            break
        except ConfigError as error:
            problems = _problems(error)
            fixes = {completion.partition("=")[0]: completion for completion in feature.completions if completion not in overrides}
            completable = [(key, message) for key, message in problems if key in fixes]
            if not completable:  # the other problems, with the feature's own keys given
                return Cell(REFUSED, tuple(_line(key, message) for key, message in problems), tuple(overrides))
            for key, message in completable:
                overrides.append(fixes[key])
                notes.append(f"needs {key}: {message}")
    instance = algorithm(config, data.info)
    deviation = feature.deviation(config, instance, data) if feature.deviation is not None else None
    if deviation is not None:
        return Cell(DEVIATES, (deviation, *notes), tuple(overrides))
    note = feature.note(config, instance, data) if feature.note is not None else None
    return Cell(SUPPORTED, (*notes, *([note] if note else [])), tuple(overrides))


@contextmanager
def _checking() -> Iterator[None]:
    """While the matrix is computed: the checks' log lines (privacy's calibration, ...), which are not
    part of it, are left out."""
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(previous)


def support_matrix(names: Iterable[str] | None = None, features: Iterable[str] | None = None) -> SupportMatrix:
    """The cells of ``names`` (default: every algorithm ``algorithm.name`` can name) with ``features``
    (keys of :data:`FEATURES`; default: all of them)."""

    names = list(names) if names is not None else list(ALGORITHMS)
    chosen = [FEATURE_KEYS[key] for key in features] if features is not None else list(FEATURES)
    matrix = SupportMatrix(names)
    checker = _Checker()
    with _checking():
        for name in names:
            algorithm = get_algorithm_class(name)
            for feature in chosen:
                if feature.task is not None:
                    matrix.cells[name, feature.key] = _task_cell(checker, algorithm, name, feature.task)
                else:
                    matrix.cells[name, feature.key] = _feature_cell(checker, algorithm, name, feature)
    return matrix


# ----------------------------------------------------------------------------- rendering


def _features_of(matrix: SupportMatrix) -> list[Feature]:
    return [feature for feature in FEATURES if any((name, feature.key) in matrix.cells for name in matrix.algorithms)]


def _grouped_notes(matrix: SupportMatrix, name: str) -> list[tuple[list[Feature], Cell]]:
    """The cells of ``name`` that have notes, those with the same status and notes together (in column order)."""
    groups: dict[tuple[Status, tuple[str, ...]], list[Feature]] = {}
    cells: dict[tuple[Status, tuple[str, ...]], Cell] = {}
    for feature in _features_of(matrix):
        cell = matrix.cell(name, feature.key)
        if cell.notes:
            groups.setdefault((cell.status, cell.notes), []).append(feature)
            cells.setdefault((cell.status, cell.notes), cell)
    return [(features, cells[key]) for key, features in groups.items()]


def matrix_text(matrix: SupportMatrix) -> str:
    """The compact table (algorithms as rows, features as columns), the legend, then each
    algorithm's reasons and deviations."""
    features = _features_of(matrix)
    width = max(len("algorithm"), *(len(name) for name in matrix.algorithms))
    columns = max(len(feature.header) for feature in features)
    lines = [LEGEND, ""]
    header = f"{'algorithm':<{width}}  " + " ".join(feature.header for feature in features)
    lines.append(header.rstrip())
    for name in matrix.algorithms:
        row = " ".join(f"{matrix.cell(name, feature.key).symbol:^{len(feature.header)}}" for feature in features)
        lines.append(f"{name:<{width}}  {row}".rstrip())
    lines += ["", "columns:", *(f"  {feature.header:<{columns}}  {feature.title}" for feature in features), ""]
    for name in matrix.algorithms:
        groups = _grouped_notes(matrix, name)
        if not groups:
            continue
        lines.append(f"{name}:")
        for group, cell in groups:
            lines.append(f"  {cell.symbol} {', '.join(feature.header for feature in group)}: {'; '.join(cell.notes)}")
    return "\n".join(lines) + "\n"


def cells_text(matrix: SupportMatrix) -> str:
    """The legend, then each algorithm's cells, one line each: the feature, its symbol and its notes."""
    features = _features_of(matrix)
    width = max(len(feature.title) for feature in features)
    lines = [LEGEND]
    for name in matrix.algorithms:
        lines += ["", f"{name}:"]
        for feature in features:
            cell = matrix.cell(name, feature.key)
            lines.append(f"  {feature.title:<{width}}  {cell.symbol}  {'; '.join(cell.notes)}".rstrip())
    return "\n".join(lines) + "\n"


def _markdown_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*").replace("_", "\\_")


def matrix_markdown(matrix: SupportMatrix) -> str:
    """docs/support_matrix.md."""
    features = _features_of(matrix)
    lines = [
        "# Support matrix",
        "",
        "<!-- Generated by `python -m fedray.runtime.support --markdown > docs/support_matrix.md`; do not edit by hand:",
        "     tests/runtime/test_support_matrix.py fails when this page and the code disagree. -->",
        "",
        "Which feature works with which algorithm, as decided by the checks every run passes before Ray starts",
        "(`fedray algorithms --matrix` prints the same; `fedray algorithms NAME --matrix` one algorithm's cells). Each",
        "cell is a tiny run config, the algorithm's base config with the feature's keys, put through the validation",
        "and `prepare_data` of `fedray run` (`fedray.runtime.support`): a refusal's message is the cell's reason,",
        "and a deviation is what the code declares the feature changes for that algorithm. A run of a ✓ or ~ cell",
        "reports the feature (smaller `bytes_up` under compression, `dp_epsilon` under DP, `malicious_clients` with",
        "attackers, `personal_*` metrics...), and a ✗ cell's run exits with code 2 and the reason, before Ray starts:",
        "`tests/runtime/test_support_walk.py` runs a sample of the cells to check both.",
        "",
        LEGEND + ".",
        "",
        "The base config: " + ", ".join(f"`{key}`" for key in BASE) + "; `algorithm.name` and the algorithm's defaults;",
        "for what the algorithm requires: "
        + "; ".join(f"{_requirement_title(requirement)} → " + ", ".join(f"`{key}`" for key in keys) for requirement, keys in MEETS.items())
        + "; Siamese heads (self-supervised algorithms) → "
        + ", ".join(f"`{key}`" for key in SIAMESE_HEADS)
        + ".",
        "The task columns read the algorithm's task requirements (`fedray algorithms` lists its tasks); the model it",
        "needs for a task's data is a matter of the model's requirements, as for any data.",
        "",
        "## Matrix",
        "",
        "| algorithm | " + " | ".join(feature.header for feature in features) + " |",
        "|---|" + "|".join(":-:" for _ in features) + "|",
    ]
    for name in matrix.algorithms:
        lines.append(f"| {name} | " + " | ".join(matrix.cell(name, feature.key).symbol for feature in features) + " |")
    lines += ["", "## Columns", "", "| column | feature | keys each cell adds to the base config |", "|---|---|---|"]
    for feature in features:
        keys = ", ".join(f"`{key}`" for key in feature.overrides) if feature.task is None else f"`data.task={feature.task}`"
        completions = f"; when a refusal asks for it: {', '.join(f'`{key}`' for key in feature.completions)}" if feature.completions else ""
        lines.append(f"| {feature.header} | {feature.title} | {keys}{completions} |")
    lines += ["", "## Reasons and deviations", ""]
    for name in matrix.algorithms:
        groups = _grouped_notes(matrix, name)
        if not groups:
            continue
        lines += [f"### {name}", ""]
        for group, cell in groups:
            headers = ", ".join(f"**{feature.header}**" for feature in group)
            lines.append(f"- {cell.symbol} {headers}: {_markdown_escape('; '.join(cell.notes))}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _requirement_title(requirement: Requirement) -> str:
    return {BATCHNORM: "BatchNorm", FEATURE_TAPS: "feature taps", IMAGES: "images", PROJECTION_HEAD: "a projection head"}.get(
        requirement, "per-client test splits"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedray.runtime.support", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help="only these algorithms (default: all)")
    parser.add_argument("--markdown", action="store_true", help="the page docs/support_matrix.md (default: the text table)")
    args = parser.parse_args(argv)
    matrix = support_matrix(args.names or None)
    sys.stdout.write(matrix_markdown(matrix) if args.markdown else matrix_text(matrix))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
