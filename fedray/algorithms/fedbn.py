"""FedBN (Li et al., "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization",
ICLR 2021).

Every BatchNorm layer stays on its client: its affine weight γ and bias β *and* its running mean
and variance. Everything else is FedAvg: a client loads the global non-BN weights and its own BN
entries (θ_0's before its first round), trains on cross-entropy for ``train.local_epochs`` and
uploads ``n_k · w_k`` restricted to the non-BN entries; the server takes the sample-weighted mean
(paper Alg. 1; the sums are reduced in the workers). FedBN has no hyperparameters, so there are no
``algorithm.*`` keys.

**Which entries are personal.** Every floating-point state-dict entry of a module that is a
``torch.nn.modules.batchnorm._BatchNorm`` (``BatchNorm1d/2d/3d``, found by type through
``named_modules``, not by name): in the CIFAR ResNets with ``model.norm: batch`` these are
``encoder.stem.1.*``, ``…norm1.*``, ``…norm2.*`` and ``…shortcut.1.*``. ``num_batches_tracked`` is an
integer buffer outside the flat layout; it is never uploaded and is not part of the client state
(it only matters for BatchNorm with ``momentum=None``, which no fedray model uses). A model without
BatchNorm (``cnn_small``, ``cnn_cifar``, ``norm: group``) would have nothing personal, making FedBN
exactly FedAvg, so such a model is refused before the run starts (``requires``).

**Evaluation.** The paper evaluates each client's model on that client's own test data, so FedBN
requires ``data.client_test_fraction > 0`` and ``eval.personalized: true``; read
``personal_accuracy`` (each client's global non-BN weights plus its own BN layers, on its held-out
split; see :mod:`fedray.algorithms.personalized`). ``test_accuracy`` is the global non-BN weights
with θ_0's untrained BN layers (initial running statistics 0/1) on the global test set: it is *not*
a FedBN model and means little.

FedBN targets feature shift (clients whose inputs differ in style), not label skew; it is defined
for supervised models.
"""

from __future__ import annotations

from torch.nn.modules.batchnorm import _BatchNorm

from fedray.algorithms.base import AlgorithmParams
from fedray.algorithms.personalized import ParameterSplit, PersonalizedAlgorithm
from fedray.algorithms.requirements import BATCHNORM
from fedray.models import FedModel


def batchnorm_keys(model: FedModel) -> list[str]:
    """The floating-point state-dict keys of every BatchNorm module of ``model``, in state-dict order."""
    bn_modules = {name for name, module in model.named_modules() if isinstance(module, _BatchNorm)}
    return [key for key, value in model.state_dict().items() if value.is_floating_point() and key.rpartition(".")[0] in bn_modules]


class FedBN(PersonalizedAlgorithm):
    name = "fedbn"
    requires = PersonalizedAlgorithm.requires | {BATCHNORM}
    Params = AlgorithmParams

    def make_split(self, model: FedModel) -> ParameterSplit:
        """π = the BatchNorm entries (weight, bias, running mean, running variance)."""
        return ParameterSplit.from_keys(model, batchnorm_keys(model))
