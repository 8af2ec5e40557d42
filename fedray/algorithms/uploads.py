"""What a client uploads, declared on its algorithm's class, so that the upload path (privacy and
robust aggregation, docs/guide/privacy.md) knows what to clip, noise or collect, and refuses what it
cannot handle before Ray starts instead of sending one part in the clear.

An algorithm lists its uploads in ``uploads`` (a class attribute of
:class:`~fedray.algorithms.base.Algorithm`, extended with ``|`` as ``requires`` is)::

    class FedProc(FedAvg):
        uploads = FedAvg.uploads | {
            Upload(
                "prototypes",
                sums=("proto_sum", "proto_weight"),
                clipped=(("proto_sum", "clip_prototypes"), ("proto_weight", "clip_counts")),
            )
        }

Under ``privacy.mechanism`` every key of an upload other than :data:`MODEL_WEIGHTS` must be either
``clipped`` (clipped per client to its bound ``privacy.<bound>`` and noised with the Gaussian
mechanism, :mod:`fedray.runtime.upload_path`) or ``constant`` (replaced by ones on every client: a
presence mask of every class, a unit weight, which reveal nothing); an upload with any other key
cannot be made private and is refused. With ``privacy.mechanism`` or ``robust.*`` set,
:func:`check_uploads` (called by :func:`fedray.algorithms.requirements.check_requirements`) refuses
an algorithm that declares nothing or declares an upload the mechanism cannot handle (every such
problem at once, :func:`upload_problems`), and the worker refuses an update with a key its algorithm
did not declare (:func:`undeclared_keys`). ``systems.compression`` compresses :data:`MODEL_WEIGHTS` and
the keys an upload declares ``model_weights`` (:mod:`fedray.systems.compression`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fedray.algorithms.declarations import Upload
from fedray.config import ConfigError, RunConfig

if TYPE_CHECKING:
    from fedray.algorithms.base import Algorithm, ClientUpdate
    from fedray.config.privacy import PrivacyConfig


@dataclass(frozen=True)
class PrivatePart:
    """One tensor that privacy clips and noises: ``key`` in the update's ``sums`` (noised on the sum
    under central DP) or its ``payload`` (per client: noised one by one), clipped to ``privacy.<bound>``."""

    key: str
    travels_in: Literal["sums", "payload"]
    bound: str


#: The model weights of a weighted-mean algorithm: ``sums["weights"] = n_k · w_k`` and
#: ``sums["num_samples"] = n_k`` (:func:`fedray.algorithms.base.weighted_sums`), a client's ``w_k``
#: being comparable with ``broadcast["weights"]``, and the server's new weights
#: ``sums["weights"] / sums["num_samples"]`` (possibly followed by a server optimizer). The upload path
#: clips it as the delta against the broadcast weights, and rewrites these two sums (the only kind
#: robust rules and attacks handle).
MODEL_WEIGHTS = Upload("model weights", sums=("weights", "num_samples"))


def no_uploads(algorithm: type[Algorithm]) -> str:
    """Why ``algorithm``, which declares no upload, gives the upload checks nothing to act on, as the
    start of a sentence: it never communicates, or it has not declared what it uploads."""
    name = algorithm.name or algorithm.__name__
    if not algorithm.communicates:
        return f"{name} uploads nothing (its clients never communicate)"
    return f"{name} does not declare what it uploads (Algorithm.uploads)"


def undeclared_keys(algorithm: type[Algorithm], update: ClientUpdate) -> list[str]:
    """The ``sums`` and ``payload`` keys of ``update`` that no upload of ``algorithm`` names."""
    sums = {key for upload in algorithm.uploads for key in upload.sums}
    payload = {key for upload in algorithm.uploads for key in upload.payload}
    return sorted(
        {f"sums[{key!r}]" for key in update.sums if key not in sums} | {f"payload[{key!r}]" for key in update.payload if key not in payload}
    )


def private_parts(algorithm: Algorithm) -> list[PrivatePart]:
    """The tensors other than the model weights that privacy clips and noises, in a fixed order (their
    noise streams are numbered by it, from 1; the model weights are part 0)."""
    parts = []
    for upload in sorted(algorithm.run_uploads(), key=lambda upload: upload.kind):
        for key, bound in upload.clipped:
            parts.append(PrivatePart(key, "sums" if key in upload.sums else "payload", bound))
    return parts


def released_parts(algorithm: Algorithm) -> int:
    """P, the number of tensors each client releases per round under privacy (the model weights and
    every :func:`private_parts`): each is noised with multiplier √P·z so that together they cost
    one Gaussian mechanism of multiplier z (:func:`fedray.privacy.mechanisms.part_noise_multiplier`)."""
    return int(MODEL_WEIGHTS in algorithm.run_uploads()) + len(private_parts(algorithm))


def config_error(problems: list[tuple[str | None, str]]) -> ConfigError:
    """One :class:`ConfigError` listing every ``(key, message)`` of ``problems`` (not empty), one line each."""
    (key, message), *more = problems
    return ConfigError(key, message, more=more)


def check_uploads(algorithm: Algorithm) -> None:
    """Raise one :class:`ConfigError` listing every :func:`upload_problems` of ``algorithm``, if any."""
    problems = upload_problems(algorithm)
    if problems:
        raise config_error(problems)


def upload_problems(algorithm: Algorithm) -> list[tuple[str | None, str]]:
    """Every ``(key, message)`` why ``privacy``/``robust``, when on, cannot handle what ``algorithm``
    uploads: robust rules and attacks handle :data:`MODEL_WEIGHTS` only; privacy also every upload
    whose keys are all ``clipped`` or ``constant``, each bound given (finite unless the noise
    multiplier is 0), a per-client part under central DP with ``privacy.sampling: fixed_size`` only;
    ``privacy.secure_aggregation`` only uploads summed over the cohort (no ``payload`` key)."""
    config: RunConfig = algorithm.config
    privacy = config.privacy
    secagg = privacy.secure_aggregation.enabled
    on = (("privacy.mechanism", privacy.enabled), ("robust.*", config.robust.enabled), ("privacy.secure_aggregation", secagg))
    keys = [key for key, enabled in on if enabled]
    if not keys:
        return []
    cls = type(algorithm)
    name = cls.name or cls.__name__
    if not cls.uploads:
        message = f"{no_uploads(cls)}, so privacy, robust rules and secure aggregation cannot handle it"
        return [(" / ".join(keys), f"{message}; use a weighted-mean algorithm such as fedavg or fedprox")]
    problems: list[tuple[str | None, str]] = []
    per_client = sorted((upload for upload in algorithm.run_uploads() if upload.payload), key=lambda upload: upload.kind)
    if secagg and per_client:
        kinds = ", ".join(f"{upload.kind} ({', '.join(f'payload[{key!r}]' for key in upload.payload)})" for upload in per_client)
        problems.append(
            (
                "privacy.secure_aggregation",
                f"{name} uploads {kinds} client by client, and secure aggregation reveals only the cohort's sum; "
                "use an algorithm whose uploads are summed, such as fedavg",
            )
        )
    others = sorted(algorithm.run_uploads() - {MODEL_WEIGHTS}, key=lambda upload: upload.kind)
    if config.robust.enabled:
        problems += _robust_problems(name, algorithm.run_uploads(), config)
    if privacy.enabled:
        problems += [problem for upload in others for problem in _in_clear(name, upload)]
        problems += [problem for upload in others for problem in _bounds_and_sampling(name, upload, privacy)]
    return problems


def robust_parts(algorithm: Algorithm) -> list[tuple[str, str]]:
    """The ``(sum key, count key or "")`` pairs a robust rule takes besides the model weights
    (``Upload.robust``: :func:`fedray.aggregation.robust.robust_sum`), in a fixed order."""
    return [pair for upload in sorted(algorithm.run_uploads() - {MODEL_WEIGHTS}, key=lambda upload: upload.kind) for pair in upload.robust]


def attack_deviation(algorithm: Algorithm) -> str | None:
    """What a model attack (``robust.attack``: sign_flip, scaled, random, alie) leaves alone in
    ``algorithm``'s uploads (None: nothing, or no such attack): the uploads besides the model
    weights, sent as the malicious client computed them (the data-poisoning attacks reach them by
    training)."""
    robust = algorithm.config.robust
    others = sorted(upload.kind for upload in algorithm.run_uploads() - {MODEL_WEIGHTS})
    if not robust.attacking or robust.attack in ("label_flip", "backdoor") or not others:
        return None
    return f"the attack alters the model weights; a malicious client's {', '.join(others)} travel as it computed them"


def privacy_deviation(algorithm: Algorithm) -> str | None:
    """What privacy changes in ``algorithm`` beyond clipping and noise (None: nothing): the keys its
    uploads declare ``constant``, which every client sends as ones."""
    constant = [(upload.kind, key) for upload in sorted(algorithm.run_uploads(), key=lambda upload: upload.kind) for key in upload.constant]
    if not constant:
        return None
    keys = ", ".join(f"{key!r} ({kind})" for kind, key in constant)
    return f"under privacy every client sends {keys} as ones, so the server no longer tells clients or classes apart by them"


def _robust_problems(name: str, uploads: frozenset[Upload], config: RunConfig) -> list[tuple[str | None, str]]:
    """Why ``robust.*`` cannot take ``uploads``: no summed model weights (what attacks and rules act on);
    an upload besides them that does not declare how a rule takes it (``Upload.robust``); per-class
    sums under a whole-update rule, or under local DP. Attackers without a rule attack the model
    weights only (:func:`attack_deviation`)."""
    robust, problems = config.robust, []
    others = sorted(uploads - {MODEL_WEIGHTS}, key=lambda upload: upload.kind)
    if MODEL_WEIGHTS not in uploads:
        kinds = ", ".join(upload.kind for upload in others)
        hints = "; ".join(f"set {upload.avoided_by}" for upload in others if upload.avoided_by)
        problems.append(
            (
                "robust.*",
                f"{name} uploads {kinds}, no summed model weights, which attacks and robust rules act on" + (f"; {hints}" if hints else ""),
            )
        )
    undeclared = [upload for upload in others if not upload.robust]
    if undeclared and robust.rule != "none":  # attackers alone attack the model weights: attack_deviation
        kinds = ", ".join(upload.kind for upload in undeclared)
        how = f"which its server combines client by client by its own rule, which robust.rule={robust.rule} cannot stand in for"
        if not any(upload.payload for upload in undeclared):
            how = f"which do not say how robust.rule={robust.rule} takes them (Upload.robust)"
        problems.append(
            ("robust.rule", f"{name} uploads {kinds}, {how}; use an algorithm whose uploads are summed, such as fedavg or fedproto")
        )
    per_class = [upload for upload in others if any(count for _, count in upload.robust)]
    if per_class and robust.rule in ("krum", "multi_krum", "bulyan"):
        kinds = ", ".join(upload.kind for upload in per_class)
        problems.append(
            (
                "robust.rule",
                f"{name} uploads {kinds} per class, and robust.rule={robust.rule} selects whole client updates by their distances, "
                "which clients holding different classes do not give; use robust.rule=median or trimmed_mean, which run per class",
            )
        )
    if per_class and robust.rule != "none" and config.privacy.mechanism == "local":
        kinds = ", ".join(upload.kind for upload in per_class)
        problems.append(
            (
                "robust.rule",
                f"robust.rule={robust.rule} takes {name}'s {kinds} per class as each client's class means (sum / count), "
                "and privacy.mechanism=local noises the counts; use central DP without a robust rule, or a rule without local DP",
            )
        )
    return problems


def _in_clear(name: str, upload: Upload) -> list[tuple[str | None, str]]:
    handled = {key for key, _ in upload.clipped} | set(upload.constant)
    in_clear = [f"sums[{key!r}]" for key in upload.sums if key not in handled]
    in_clear += [f"payload[{key!r}]" for key in upload.payload if key not in handled]
    if not in_clear:
        return []
    hint = f"; set {upload.avoided_by}" if upload.avoided_by else ""
    return [
        (
            "privacy.mechanism",
            f"{name} uploads {upload.kind} ({', '.join(in_clear)}), which cannot be clipped and noised: it would be sent in the clear{hint}",
        )
    ]


def _bounds_and_sampling(name: str, upload: Upload, privacy: PrivacyConfig) -> list[tuple[str | None, str]]:
    problems: list[tuple[str | None, str]] = []
    for key, bound in upload.clipped:
        value = getattr(privacy, bound)
        if value is None:
            problems.append((f"privacy.{bound}", f"{name} uploads {upload.kind} ({key!r}); give the L2 bound each client's is clipped to"))
        elif math.isinf(value) and privacy.noise_multiplier != 0:
            problems.append((f"privacy.{bound}", "must be finite when the noise multiplier is not 0 (the noise std is z·bound)"))
    if upload.payload and upload.clipped and privacy.mechanism == "central" and privacy.sampling != "fixed_size":
        problems.append(
            (
                "privacy.sampling",
                f"{name} uploads {upload.kind} per client, one noised entry each, which only replace-one neighbours "
                "bound (adding a client adds an entry); set privacy.sampling=fixed_size",
            )
        )
    return problems
