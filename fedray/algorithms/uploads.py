"""What a client uploads, declared on its algorithm's class, so that the upload path (privacy and
robust aggregation, docs/guide/privacy.md) knows what to clip, noise or collect, and refuses what it
cannot handle before Ray starts instead of sending one part in the clear.

An algorithm lists its uploads in ``uploads`` (a class attribute of
:class:`~fedray.algorithms.base.Algorithm`, extended with ``|`` as ``requires`` is)::

    class FedProc(FedAvg):
        uploads = FedAvg.uploads | {Upload("prototypes", sums=("proto_sum", "proto_weight"))}

With ``privacy.mechanism`` or ``robust.*`` set, :func:`check_uploads` (called by
:func:`fedray.algorithms.requirements.check_requirements`) refuses an algorithm that declares nothing
or declares an upload the mechanism cannot handle, and the worker refuses an update with a key its
algorithm did not declare (:func:`undeclared_keys`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedray.config import ConfigError, RunConfig

if TYPE_CHECKING:
    from fedray.algorithms.base import Algorithm, ClientUpdate


@dataclass(frozen=True)
class Upload:
    """One kind of upload (``kind``: model weights, prototypes, class representations, kernel
    matrices, control variates, ...) and the :class:`~fedray.algorithms.base.ClientUpdate` keys it
    travels in."""

    kind: str
    sums: tuple[str, ...] = ()
    payload: tuple[str, ...] = ()


#: The model weights of a weighted-mean algorithm: ``sums["weights"] = n_k · w_k`` and
#: ``sums["num_samples"] = n_k`` (:func:`fedray.algorithms.base.weighted_sums`), a client's ``w_k``
#: being comparable with ``broadcast["weights"]``, and the server's new weights
#: ``sums["weights"] / sums["num_samples"]`` (possibly followed by a server optimizer). The only kind
#: the upload path clips, noises and aggregates robustly: it rewrites these two sums.
MODEL_WEIGHTS = Upload("model weights", sums=("weights", "num_samples"))


def undeclared_keys(algorithm: type[Algorithm], update: ClientUpdate) -> list[str]:
    """The ``sums`` and ``payload`` keys of ``update`` that no upload of ``algorithm`` names."""
    sums = {key for upload in algorithm.uploads for key in upload.sums}
    payload = {key for upload in algorithm.uploads for key in upload.payload}
    return sorted(
        {f"sums[{key!r}]" for key in update.sums if key not in sums} | {f"payload[{key!r}]" for key in update.payload if key not in payload}
    )


def check_uploads(algorithm: Algorithm) -> None:
    """Raise :class:`ConfigError` if ``privacy``/``robust`` are on and ``algorithm`` uploads anything
    but :data:`MODEL_WEIGHTS`."""
    config: RunConfig = algorithm.config
    keys = [key for key, on in (("privacy.mechanism", config.privacy.enabled), ("robust.*", config.robust.enabled)) if on]
    if not keys:
        return
    cls = type(algorithm)
    name = cls.name or cls.__name__
    if not cls.uploads:
        message = f"{name} does not declare what it uploads (Algorithm.uploads), so it cannot be made private or robust"
    elif cls.uploads != {MODEL_WEIGHTS}:
        others = ", ".join(sorted(upload.kind for upload in cls.uploads - {MODEL_WEIGHTS}))
        message = (
            f"{name} uploads {others}, which the upload path cannot clip, noise or aggregate robustly yet "
            "(it handles model weights of weighted-mean algorithms); it would send them in the clear"
        )
    else:
        return
    raise ConfigError(" / ".join(keys), f"{message}; use a weighted-mean algorithm such as fedavg or fedprox")
