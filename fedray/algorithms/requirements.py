"""What an algorithm needs from the model and the config, declared on its class and checked before
Ray starts.

An algorithm lists its needs in ``requires`` (a class attribute of
:class:`~fedray.algorithms.base.Algorithm`, inherited and extended with ``|``)::

    class FedBN(PersonalizedAlgorithm):
        requires = PersonalizedAlgorithm.requires | {BATCHNORM}

:func:`check_requirements` (called by :func:`fedray.runtime.experiment.prepare_data` on the model the
algorithm builds) refuses a run whose model or config lacks one, with one line naming what is missing
and the key that supplies it (every unmet one, and the algorithm's other problems, in one error),
instead of letting the algorithm run as something else (FedBN without BatchNorm is FedAvg; FedPer
without per-client test splits reports only a global model with an untrained head).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch.nn.modules.batchnorm import _BatchNorm

from fedray.algorithms.declarations import Requirement
from fedray.algorithms.uploads import config_error, upload_problems
from fedray.models import FedModel
from fedray.tasks import TASKS, task_class

if TYPE_CHECKING:
    from fedray.algorithms.base import Algorithm


BATCHNORM = Requirement(
    keys="model.name / model.norm",
    what="BatchNorm layers and model {model} has none (it would run as FedAvg)",
    remedy="use a model with BatchNorm, e.g. model.name=resnet8 with model.norm=batch",
    is_met=lambda config, model, info: any(isinstance(module, _BatchNorm) for module in model.modules()),
)
PROJECTION_HEAD = Requirement(
    keys="model.projection_dim",
    what="a projection head (it contrasts projection-head outputs)",
    remedy="set model.projection_dim to a positive size (e.g. 256 as in MOON on CIFAR, 32 on digits)",
    is_met=lambda config, model, info: model.projector is not None,
)
FEATURE_TAPS = Requirement(
    keys="model.name",
    what="intermediate feature maps (the model's tap_names) and model {model} has none",
    remedy="use a built-in model (cnn_small, cnn_cifar, resnet8/10/18) or a fedray.FedModel subclass that sets tap_names",
    is_met=lambda config, model, info: len(model.tap_names) > 0,
)
PERSONAL_TEST_SPLITS = Requirement(
    keys="data.client_test_fraction / eval.personalized",
    what="per-client test splits: it is personalised, so its result is each client's model on its own held-out "
    "split (test_accuracy alone is a global model with an untrained personal part)",
    remedy="set data.client_test_fraction=0.25 and eval.personalized=true",
    is_met=lambda config, model, info: config.eval.personalized,
)

IMAGES = Requirement(
    keys="data.name",
    what="images (it trains on two augmented views of each) and data.name={data} holds {modality}",
    remedy="use an image dataset (digits, fmnist, cifar10, ..., an imagefolder, or a table with data.image_column)",
    is_met=lambda config, model, info: info.modality == "image",
)


CLASS_LABELS = Requirement(
    keys="data.task",
    what="one class label per sample (its maths is per class: prototypes, class counts or a class-balanced loss) "
    "and data.task={task} has none",
    remedy="use data.task=classification, or an algorithm that serves every task (fedray algorithms lists them)",
    is_met=lambda config, model, info: task_class(config.data.task).class_labels,
)
PER_SAMPLE_OUTPUTS = Requirement(
    keys="data.task",
    what="one feature vector per sample (it contrasts or decorrelates per-sample features) and data.task={task} gives one per position",
    remedy="use a task with one output per sample (classification, regression, multilabel)",
    is_met=lambda config, model, info: task_class(config.data.task).per_sample_outputs,
)

#: The requirements a task can fail, each with the task attribute (fedray.tasks.Task) it reads.
TASK_REQUIREMENTS = {CLASS_LABELS: "class_labels", PER_SAMPLE_OUTPUTS: "per_sample_outputs"}

#: The order in which unmet requirements are reported: the task's, the model's, the config's.
CHECK_ORDER = (CLASS_LABELS, PER_SAMPLE_OUTPUTS, IMAGES, BATCHNORM, PROJECTION_HEAD, FEATURE_TAPS, PERSONAL_TEST_SPLITS)


def supported_tasks(algorithm: type[Algorithm]) -> tuple[str, ...]:
    """The built-in tasks (:data:`fedray.tasks.TASKS`) that meet ``algorithm``'s task requirements
    (what ``fedray algorithms`` lists)."""
    needs = [attribute for requirement, attribute in TASK_REQUIREMENTS.items() if requirement in algorithm.requires]
    return tuple(name for name, task in TASKS.items() if all(getattr(task, attribute) for attribute in needs))


def is_personalised(algorithm: type[Algorithm]) -> bool:
    """Whether ``algorithm`` is evaluated by each client's own model (it requires per-client test splits)."""
    return PERSONAL_TEST_SPLITS in algorithm.requires


def requirement_problems(algorithm: Algorithm, model: FedModel) -> list[tuple[str | None, str]]:
    """Every problem of ``algorithm`` with its config and ``model`` (the algorithm's built model) as
    ``(key, message)``: the ``type(algorithm).requires`` they do not meet (in :data:`CHECK_ORDER`, then
    any an algorithm defines itself) and the uploads that ``privacy``/``robust`` cannot handle
    (:func:`fedray.algorithms.uploads.upload_problems`). :func:`fedray.runtime.experiment.prepare_data`
    adds what the systems model needs of the uploads and refuses them all in one message."""
    cls = type(algorithm)
    own = sorted(cls.requires - set(CHECK_ORDER), key=lambda requirement: requirement.keys)
    problems: list[tuple[str | None, str]] = [
        (requirement.keys, requirement.message(cls.name or cls.__name__, algorithm.config, algorithm.info))
        for requirement in [r for r in CHECK_ORDER if r in cls.requires] + own
        if not requirement.is_met(algorithm.config, model, algorithm.info)
    ]
    return problems + upload_problems(algorithm)


def check_requirements(algorithm: Algorithm, model: FedModel) -> None:
    """:func:`requirement_problems` as one :class:`ConfigError` listing them all, one line each."""
    problems = requirement_problems(algorithm, model)
    if problems:
        raise config_error(problems)
