"""What an algorithm needs from the model and the config, declared on its class and checked before
Ray starts.

An algorithm lists its needs in ``requires`` (a class attribute of
:class:`~fedray.algorithms.base.Algorithm`, inherited and extended with ``|``)::

    class FedBN(PersonalizedAlgorithm):
        requires = PersonalizedAlgorithm.requires | {BATCHNORM}

:func:`check_requirements` (called by :func:`fedray.runtime.experiment.prepare_data` on the model the
algorithm builds) refuses a run whose model or config lacks one, with one line naming what is missing
and the key that supplies it, instead of letting the algorithm run as something else (FedBN without
BatchNorm is FedAvg; FedPer without per-client test splits reports only a global model with an
untrained head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from torch.nn.modules.batchnorm import _BatchNorm

from fedray.algorithms.uploads import check_uploads
from fedray.config import ConfigError, RunConfig
from fedray.data import DatasetInfo
from fedray.models import FedModel

if TYPE_CHECKING:
    from fedray.algorithms.base import Algorithm


@dataclass(frozen=True)
class Requirement:
    """One need: ``is_met(config, model, info)``, and the message when it is not, ``"{keys}: {name}
    needs {what}; {remedy}"`` (``{model}`` in ``what``/``remedy`` is replaced by ``model.name``,
    ``{data}`` by ``data.name`` and ``{modality}`` by the data's modality)."""

    keys: str  # the config key(s) that supply it
    what: str
    remedy: str
    is_met: Callable[[RunConfig, FedModel, DatasetInfo], bool]

    def message(self, algorithm_name: str, config: RunConfig, info: DatasetInfo) -> str:
        text = f"{algorithm_name} needs {self.what}; {self.remedy}"
        return (
            text.replace("{model}", repr(config.model.name)).replace("{data}", repr(config.data.name)).replace("{modality}", info.modality)
        )


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


#: The order in which unmet requirements are reported (the first one only): the model's before the config's.
CHECK_ORDER = (IMAGES, BATCHNORM, PROJECTION_HEAD, FEATURE_TAPS, PERSONAL_TEST_SPLITS)


def is_personalised(algorithm: type[Algorithm]) -> bool:
    """Whether ``algorithm`` is evaluated by each client's own model (it requires per-client test splits)."""
    return PERSONAL_TEST_SPLITS in algorithm.requires


def check_requirements(algorithm: Algorithm, model: FedModel) -> None:
    """Raise :class:`ConfigError` for the first (in :data:`CHECK_ORDER`, then any an algorithm defines
    itself) of ``type(algorithm).requires`` that ``algorithm.config`` and ``model`` (the algorithm's built
    model) do not meet, then for uploads that ``privacy``/``robust`` cannot handle
    (:func:`fedray.algorithms.uploads.check_uploads`)."""
    cls = type(algorithm)
    own = sorted(cls.requires - set(CHECK_ORDER), key=lambda requirement: requirement.keys)
    for requirement in [r for r in CHECK_ORDER if r in cls.requires] + own:
        if not requirement.is_met(algorithm.config, model, algorithm.info):
            raise ConfigError(requirement.keys, requirement.message(cls.name or cls.__name__, algorithm.config, algorithm.info))
    check_uploads(algorithm)
