"""The types of what an algorithm declares on its class (:class:`~fedray.algorithms.base.Algorithm`):
``requires``, a set of :class:`Requirement` (the needs :mod:`fedray.algorithms.requirements` defines
and checks), and ``uploads``, a set of :class:`Upload` (the upload kinds :mod:`fedray.algorithms.uploads`
defines and checks). Here, below all three, so that the base class and the modules that check its
declarations do not import each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from fedray.config import RunConfig
    from fedray.data import DatasetInfo
    from fedray.models import FedModel


@dataclass(frozen=True)
class Requirement:
    """One need: ``is_met(config, model, info)``, and the message when it is not, ``"{keys}: {name}
    needs {what}; {remedy}"`` (``{model}`` in ``what``/``remedy`` is replaced by ``model.name``,
    ``{data}`` by ``data.name``, ``{task}`` by ``data.task`` and ``{modality}`` by the data's modality)."""

    keys: str  # the config key(s) that supply it
    what: str
    remedy: str
    is_met: Callable[[RunConfig, FedModel, DatasetInfo], bool]

    def message(self, algorithm_name: str, config: RunConfig, info: DatasetInfo) -> str:
        text = f"{algorithm_name} needs {self.what}; {self.remedy}"
        return (
            text.replace("{model}", repr(config.model.name))
            .replace("{data}", repr(config.data.name))
            .replace("{task}", config.data.task)
            .replace("{modality}", info.modality)
        )


@dataclass(frozen=True)
class Upload:
    """One kind of upload (``kind``: model weights, prototypes, class representations, kernel
    matrices, control variates, ...) and the :class:`~fedray.algorithms.base.ClientUpdate` keys it
    travels in."""

    kind: str
    sums: tuple[str, ...] = ()
    payload: tuple[str, ...] = ()
    #: (key, bound) pairs: the tensors privacy clips, all by one factor per client so that each is
    #: within ``privacy.<bound>`` (a class-sum and its count keep their ratio), then noises
    clipped: tuple[tuple[str, str], ...] = ()
    #: keys replaced by ``torch.ones_like`` under privacy (the same for every client)
    constant: tuple[str, ...] = ()
    #: the setting that leaves this upload out, named when privacy refuses it
    avoided_by: str = ""
    #: payload keys holding the client's own flat model weights (comparable with ``broadcast["weights"]``,
    #: as FedSKC's per-client weights): ``systems.compression`` encodes each as its update against them
    model_weights: tuple[str, ...] = ()
    #: the other float tensors ``systems.compression`` encodes, each as one vector (prototype sums,
    #: logit knowledge, control-variate deltas, representations); keys left out (counts, presence
    #: masks: a few numbers a class, as the weights' ``num_samples``) travel as they are
    compressed: tuple[str, ...] = ()
    #: how ``robust.rule`` takes this upload over the clients in place of its sum (empty: it cannot,
    #: and robust rules are refused): ``(sum key, count key)`` pairs of per-class sums whose ratio is
    #: each class's mean (prototypes: the rule runs per class over the clients holding it), and
    #: ``(sum key, "")`` for a vector in one space on every client (a control-variate delta: the rule
    #: runs over the clients' vectors)
    robust: tuple[tuple[str, str], ...] = ()
