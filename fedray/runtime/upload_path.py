"""The upload path between a client's update and the algorithm's ``aggregate`` (docs/guide/privacy.md):
attack (simulated malicious clients) → clipping → local noise → compression (``systems.compression``)
→ worker pre-aggregation → central noise on the sum → the aggregation rule (weighted mean, or a robust
rule over per-client updates).

Its main subject is :data:`~fedray.algorithms.uploads.MODEL_WEIGHTS`. A client's update is its delta
Δ_k = w_k − w against the broadcast weights w. The path rewrites the two sums so that the algorithm's
own ``sums["weights"] / sums["num_samples"]`` (and any server optimizer after it) yields:

- central DP: w + (Σ_k clip(Δ_k) + N(0, σ²)) / m, σ = z·C·m/M, m = ``train.clients_per_round`` (the
  fixed denominator of DP-FedAvg, uniform client weights; :mod:`fedray.privacy.mechanisms`), or under
  ``train.mode: async`` m = M = K = ``systems.fedbuff.buffer_size``, over the buffer's staleness-weighted
  deltas (:meth:`ServerUploadPath.apply_buffer`);
- adaptive clipping (``privacy.clipping: adaptive``, central DP): C is the round's bound, which the
  server broadcasts (:data:`ADAPTIVE_CLIP`) and moves after the round towards a quantile of the
  update norms, and the sum's noise multiplier is z_Δ (:mod:`fedray.privacy.mechanisms`);
- local DP: w + Σ_k (clip(Δ_k) + N(0, (z·C)²)) / k over the k aggregated clients;
- a robust rule: w + rule([Δ_k]) over the clients' individual deltas, which the workers then collect as
  ``payload`` instead of summing them; an upload besides the weights that declares how
  (``Upload.robust``: per-class sums, SCAFFOLD's Δc_i) is collected too, and its sum replaced by the
  rule's (:func:`fedray.aggregation.robust.robust_sum`);
- ``robust.attack: alie`` (Baruch et al., NeurIPS 2019): the deltas are collected as under a rule (with
  each client's sample count when there is none), and the server replaces the malicious clients'
  (``metrics["malicious"]``) by μ − z·σ of the benign ones before the rule or the weighted mean
  Σ_k n_k·Δ_k / Σ_k n_k (:func:`fedray.aggregation.attacks.alie_updates`).

The data-poisoning attacks (``label_flip``, ``backdoor``) act before training: the worker gives a
malicious client poisoned data (:meth:`ClientUploadPath.poisoned_data`), and its update here is
scaled by ``robust.boost`` when that is not 1.

Under privacy every other upload a client makes (prototypes, class representations, logit knowledge,
per-class counts, SCAFFOLD's control variates: :func:`~fedray.algorithms.uploads.private_parts`) is clipped on the worker, each
upload's tensors by one factor so that each is within its own bound, and noised with the same
Gaussian mechanism: a part summed over the cohort gets noise on the sum (central; std z_i·C_i·m/M) or
on each client (local), a part the server needs client by client gets noise z_i·C_i on each client's
copy, from the trusted server under central DP, which then hands these copies to ``aggregate`` under
anonymous keys 0..K−1 in a seeded random order, so that the round's release does not depend on which
clients were sampled (the condition of amplification by sampling). Each of the P released parts has
multiplier z_i = √P·z: together one Gaussian mechanism of multiplier z, the one the accountant
charges (:mod:`fedray.privacy.mechanisms`). Keys an upload declares ``constant`` (presence masks, sample
counts) are replaced by ones. Other uploads are refused before Ray starts
(:func:`~fedray.algorithms.uploads.check_uploads`).

Compression (:mod:`fedray.systems.compression`) is the last step on the client, as on a device (a
client's own weights sent in its payload, FedSKC's outside ``gda_mode: fedavg``, are compressed the
same way, as their update against the broadcast weights, and the server receives w + the decoded
update in their place): what
it encodes is what leaves the device and is counted in ``bytes_up``, and what the server decodes
replaces Δ_k above (a robust rule gets the decoded deltas). It comes after clipping and local noise,
so that local DP's guarantee holds by post-processing and the noisy update is still what gets
compressed (noise added after top-k would make the upload dense again). Under central DP the trusted
server clips the decoded update to C once more, since int8 rounding, and error feedback's residual,
can take it past C and the noise is calibrated to C.

Nothing here runs on the workers when ``privacy``, ``robust`` and ``systems.compression`` are off,
nor on the server when ``privacy`` and ``robust`` are (the engine and worker hold ``None``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedray.aggregation.attacks import MODEL_ATTACKS, Attackers, alie_updates, alie_z, attacked_delta, poisoned_data
from fedray.aggregation.robust import robust_aggregate, robust_sum
from fedray.algorithms import Algorithm, ClientUpdate, RoundResults
from fedray.algorithms.uploads import PrivatePart, private_parts, released_parts, robust_parts, undeclared_keys
from fedray.config import ConfigError, RunConfig
from fedray.config.privacy import (
    adaptive_noise_problem,
    aggregated_cohort,
    clipped_count_stddev,
    default_delta,
    noise_cohort_size,
    population_size,
)
from fedray.privacy.secure_aggregation import realised_noise_multiplier, survivor_threshold
from fedray.privacy.clipping import clip_jointly, clip_to_norm, next_adaptive_clip
from fedray.privacy.mechanisms import (
    central_noise,
    central_noise_std,
    clipped_count_noise,
    local_noise,
    part_noise_multiplier,
    update_noise_multiplier,
)
from fedray.runtime.errors import RunError
from fedray.seeding import derive_seed
from fedray.systems.clock import UPLOAD_BYTES_METRIC, payload_bytes, sums_bytes
from fedray.systems.fedbuff import buffered_results
from fedray.systems.compression import (
    WEIGHTS,
    Residuals,
    UploadCompression,
    compressed_parts,
    compressed_uploads,
    compression_enabled,
    join_client_state,
)

if TYPE_CHECKING:  # dp-accounting is the optional extra `privacy`: imported only when privacy is on
    from fedray.privacy.accountant import CentralAccountant
    from fedray.privacy.audit import CanaryAudit

logger = logging.getLogger(__name__)

#: The payload key under which a client's delta travels when a robust rule (or ALIE) needs it alone.
ROBUST_UPDATE = "robust_update"
#: The payload key of a client's weight (its number of samples) when its delta is collected for ALIE without a robust rule.
ROBUST_WEIGHT = "robust_num_samples"
#: The broadcast key of the round's clip bound C under ``privacy.clipping: adaptive`` (float64 scalar).
ADAPTIVE_CLIP = "dp_clip"
#: derive_seed stream of the order in which per-client parts reach ``aggregate`` under central DP
ANONYMOUS_ORDER_STREAM = 4405


class PrivacyBudgetExhausted(RunError):
    """The next round would spend more than ``privacy.target_epsilon``."""

    fedray_exit_code = 3

    def __reduce__(self) -> tuple[type, tuple[str]]:  # Ray pickles it out of the server actor
        return type(self), (str(self),)


def upload_path_enabled(config: RunConfig) -> bool:
    return config.privacy.enabled or config.robust.enabled


def distributed_noise(config: RunConfig) -> bool:
    """Whether each client adds its share of the central noise (``privacy.secure_aggregation.noise: distributed``)."""
    secagg = config.privacy.secure_aggregation
    return secagg.enabled and secagg.noise == "distributed" and config.privacy.mechanism == "central"


class ClientUploadPath:
    """The worker's part, per client: attack, clip, local noise, compression, and the form the update travels in."""

    def __init__(self, config: RunConfig, algorithm: Algorithm, num_clients: int) -> None:
        self.config = config
        self.algorithm_class = type(algorithm)
        self.attackers = Attackers(config, num_clients)
        self.num_classes = algorithm.info.num_classes
        self.compression = UploadCompression.for_run(config)  # None: systems.compression off
        self.warned_uncompressed = False
        #: payload keys holding a client's own model weights, compressed as their update (FedSKC outside gda_mode=fedavg)
        self.payload_weights = [key for upload in compressed_uploads(algorithm) for key in upload.model_weights]
        #: the other tensors compression encodes, as (key, "sums" or "payload"), numbered from 1 in this order
        self.compressed_parts = compressed_parts(algorithm) if self.compression is not None else []
        #: the uploads besides the weights a robust rule takes, collected per client (Upload.robust)
        self.robust_keys = [key for pair in robust_parts(algorithm) for key in pair if key] if config.robust.rule != "none" else []
        uploads = algorithm.run_uploads() if config.privacy.enabled else frozenset()
        self.private_uploads = sorted((upload for upload in uploads if upload.clipped or upload.constant), key=lambda upload: upload.kind)
        self.parts = private_parts(algorithm) if config.privacy.enabled else []
        self.released_parts = released_parts(algorithm) if config.privacy.enabled else 1
        self.distributed = distributed_noise(config)

    @classmethod
    def for_run(cls, config: RunConfig, algorithm: Algorithm, num_clients: int) -> "ClientUploadPath | None":
        return cls(config, algorithm, num_clients) if upload_path_enabled(config) or compression_enabled(config) else None

    def poisoned_data(self, round: int, client_id: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A client's training data ``x``, ``y`` as it trains on them: poisoned when it is malicious
        in ``round`` under a data-poisoning ``robust.attack`` (label_flip, backdoor), else as given."""
        robust = self.config.robust
        if robust.attack not in ("label_flip", "backdoor") or not robust.attacking or not self.attackers.is_malicious(round, client_id):
            return x, y
        return poisoned_data(self.config, self.num_classes, round, client_id, x, y)

    @property
    def keeps_residuals(self) -> bool:
        """Whether clients carry an error-feedback residual (client state) from one upload to the next."""
        return self.compression is not None and self.compression.error_feedback

    def apply(
        self, round: int, client_id: int, update: ClientUpdate, broadcast: dict[str, Any], residuals: Residuals | None = None
    ) -> ClientUpdate:
        """``update`` as it leaves the client (a new object; ``update`` is not changed). ``residuals``:
        the client's error-feedback residuals (:mod:`fedray.systems.compression`), whose successors
        the returned update's ``state`` holds next to the algorithm's own."""
        undeclared = undeclared_keys(self.algorithm_class, update)
        if undeclared:
            raise TypeError(f"algorithm {self.algorithm_class.name} uploads {', '.join(undeclared)}, which its `uploads` do not declare")
        residuals = dict(residuals or {})
        wire: dict[str, int] = {}  # the bytes each compressed key of the update takes on the wire
        if "weights" in update.sums:
            sums, payload, metrics = self.weights_update(round, client_id, update, broadcast, residuals, wire)
        else:  # the model weights travel in the payload (FedSKC outside gda_mode=fedavg), or not at all
            sums, metrics = dict(update.sums), dict(update.metrics)
            payload = self.compress_payload_weights(round, client_id, update.payload, broadcast, residuals, wire)
        if self.config.privacy.enabled:
            self.privatise_parts(round, client_id, sums, payload, metrics)
        if self.compression is not None:
            self.compress_parts(round, client_id, sums, payload, residuals, wire)
            if wire:
                unchanged = sums_bytes({key: value for key, value in update.sums.items() if key not in wire})
                unchanged += payload_bytes({key: value for key, value in update.payload.items() if key not in wire})
                metrics[UPLOAD_BYTES_METRIC] = float(unchanged + sum(wire.values()))
            elif not self.warned_uncompressed:
                logger.warning(
                    "%s uploaded nothing it declares compressible: systems.compression left it as it is", self.algorithm_class.name
                )
                self.warned_uncompressed = True
        for key in self.robust_keys:  # a robust rule needs each client's, not the cohort's sum
            payload[f"{ROBUST_UPDATE}:{key}"] = sums.pop(key)
        return ClientUpdate(sums=sums, payload=payload, metrics=metrics, state=join_client_state(update.state, residuals))

    def weights_update(
        self, round: int, client_id: int, update: ClientUpdate, broadcast: dict[str, Any], residuals: Residuals, wire: dict[str, int]
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
        """The update's ``sums``, ``payload`` and ``metrics`` with its model weights as they leave the
        client (attacked, clipped, noised, compressed: the module docstring), in the form the server
        needs them (a sum, or a robust rule's per-client delta); ``residuals`` and ``wire`` updated in place."""
        privacy, robust, seed = self.config.privacy, self.config.robust, self.config.seed
        num_samples = update.sums["num_samples"]
        reference = broadcast["weights"].to(num_samples.device, torch.float64)
        delta = update.sums["weights"].double() / num_samples - reference
        metrics = dict(update.metrics)
        is_malicious = robust.attacking and self.attackers.is_malicious(round, client_id)
        if is_malicious:
            if robust.attack in MODEL_ATTACKS:
                delta = attacked_delta(delta, robust.attack, robust.attack_scale, seed, round, client_id)
            elif robust.boost != 1:  # a data-poisoning attacker's boosted update (model replacement); alie: on the server
                delta = robust.boost * delta
            metrics["malicious"] = 1.0
        clip = float(broadcast[ADAPTIVE_CLIP]) if privacy.clipping == "adaptive" else privacy.clip  # the round's C
        if privacy.enabled:
            delta, norm = clip_to_norm(delta, clip)
            metrics["update_norm"] = norm
            if privacy.mechanism == "local" and privacy.noise_multiplier:
                delta = delta + local_noise(seed, round, client_id, delta, self.part_multiplier * clip)
            elif self.distributed and privacy.noise_multiplier:
                delta = delta + local_noise(seed, round, client_id, delta, self.noise_share_std(clip))
        if self.compression is not None:
            compressed = self.compression.compress(round, client_id, delta, residuals.get(WEIGHTS))
            wire["weights"] = compressed.wire_bytes
            delta = compressed.received.to(torch.float64)
            self._keep(residuals, WEIGHTS, compressed.residual)
            if privacy.mechanism == "central":
                delta, _ = clip_to_norm(delta, clip)
        sums, payload = dict(update.sums), dict(update.payload)
        if robust.collects_updates:
            del sums["weights"], sums["num_samples"]
            payload[ROBUST_UPDATE] = delta
            if robust.rule == "none":  # ALIE before the weighted mean, which the server then computes
                payload[ROBUST_WEIGHT] = num_samples.to(torch.float64)
        elif privacy.enabled:
            sums["weights"], sums["num_samples"] = delta, torch.ones_like(num_samples, dtype=torch.float64)
        elif is_malicious or self.compression is not None:  # the plain weighted mean: the client's weight is kept
            sums["weights"] = (reference + delta) * num_samples
        return sums, payload, metrics

    def compress_payload_weights(
        self, round: int, client_id: int, payload: dict[str, Any], broadcast: dict[str, Any], residuals: Residuals, wire: dict[str, int]
    ) -> dict[str, Any]:
        """``payload`` with the model weights it carries (:attr:`payload_weights`, only compression on)
        as the server receives them: each client's w_k sent as Δ_k = w_k − w against the broadcast
        weights w (the keys one after the other, one vector with one residual), and replaced by
        w + decode(C(Δ_k)); ``residuals`` and ``wire`` updated in place."""
        keys = [key for key in self.payload_weights if key in payload]
        if self.compression is None or not keys:
            return dict(payload)
        payload = dict(payload)
        reference = broadcast["weights"].to(torch.float64)
        sent = [payload[key] for key in keys]
        delta = torch.cat([weights.to(reference.device, torch.float64) - reference for weights in sent])
        compressed = self.compression.compress(round, client_id, delta, residuals.get(WEIGHTS))
        wire.update({key: compressed.wire_bytes if index == 0 else 0 for index, key in enumerate(keys)})
        self._keep(residuals, WEIGHTS, compressed.residual)
        received = compressed.received.to(reference.device, torch.float64).split(reference.numel())
        for key, weights, part in zip(keys, sent, received):
            payload[key] = (reference + part).to(weights.dtype).to(weights.device)
        return payload

    def compress_parts(
        self, round: int, client_id: int, sums: dict[str, Any], payload: dict[str, Any], residuals: Residuals, wire: dict[str, int]
    ) -> None:
        """The update's other compressed tensors (:func:`~fedray.systems.compression.compressed_parts`:
        prototype sums, logit knowledge, control-variate deltas...), in place: each flattened,
        encoded in float32 as it is, and replaced by what the server decodes, in its own shape and
        dtype. After privacy's clipping and local noise, as the weights; under central DP a clipped
        tensor is clipped to its bound once more, as the decoded weights are."""
        assert self.compression is not None
        central_bounds = {part.key: getattr(self.config.privacy, part.bound) for part in self.parts}
        central_bounds = central_bounds if self.config.privacy.mechanism == "central" else {}
        for index, (key, travels_in) in enumerate(self.compressed_parts, start=1):
            container = sums if travels_in == "sums" else payload
            if key not in container:
                continue
            value = container[key]
            compressed = self.compression.compress(round, client_id, value.reshape(-1), residuals.get(key), part=index)
            received = compressed.received.view(value.shape).to(value.device)
            if key in central_bounds:
                received, _ = clip_to_norm(received, central_bounds[key])
            container[key] = received.to(value.dtype)
            wire[key] = compressed.wire_bytes
            self._keep(residuals, key, compressed.residual)

    @staticmethod
    def _keep(residuals: Residuals, key: str, residual: torch.Tensor | None) -> None:
        """Error feedback: the tensor's new residual replaces its last one (None: error feedback is off)."""
        if residual is not None:
            residuals[key] = residual

    @property
    def part_multiplier(self) -> float:
        """Local DP: z_i = √P·z, the noise multiplier of each of the client's P released parts."""
        return part_noise_multiplier(self.config.privacy.noise_multiplier or 0.0, self.released_parts)

    def noise_share_std(self, bound: float) -> float:
        """Distributed noise: σ/√m, the std of one client's share of the central noise σ = z_i·C·m/M on a
        part clipped to ``bound`` = C, so that the m = ``train.clients_per_round`` shares sum to N(0, σ²)
        (:mod:`fedray.privacy.secure_aggregation`)."""
        cohort = self.config.train.clients_per_round
        return central_noise_std(self.part_multiplier, bound, cohort, noise_cohort_size(self.config)) / cohort**0.5

    def privatise_parts(self, round: int, client_id: int, sums: dict[str, Any], payload: dict[str, Any], metrics: dict[str, float]) -> None:
        """The client's uploads other than the weights, in place: ``constant`` keys replaced by ones;
        each upload's ``clipped`` tensors scaled by one factor so that each is within its bound (its
        norm before, in ``metrics["update_norm_<key>"]``), then under local DP noised with z_i·C_i."""
        privacy = self.config.privacy
        part_index = {part.key: index for index, part in enumerate(self.parts, start=1)}
        for upload in self.private_uploads:
            for key in upload.constant:
                container = sums if key in upload.sums else payload
                container[key] = torch.ones_like(torch.as_tensor(container[key]))
            if not upload.clipped:
                continue
            containers = [sums if key in upload.sums else payload for key, _ in upload.clipped]
            bounds = [getattr(privacy, bound) for _, bound in upload.clipped]
            clipped, norms = clip_jointly([container[key] for container, (key, _) in zip(containers, upload.clipped)], bounds)
            for container, (key, _), value, norm, bound in zip(containers, upload.clipped, clipped, norms, bounds):
                metrics[f"update_norm_{key}"] = norm
                std = self.part_multiplier * bound if privacy.mechanism == "local" else self.noise_share_std(bound)
                if (privacy.mechanism == "local" or self.distributed) and privacy.noise_multiplier:
                    noise = local_noise(self.config.seed, round, client_id, value, std, part_index[key])
                    value = (value.double() + noise).to(value.dtype)
                container[key] = value


class ServerUploadPath:
    """The server's part: central noise, adaptive clipping's bound, the robust rule, the accountant and its budget."""

    def __init__(self, config: RunConfig, algorithm: Algorithm | None = None) -> None:
        """``algorithm``: what its clients upload (None: model weights only)."""
        self.config = config
        privacy = config.privacy
        self.parts: list[PrivatePart] = private_parts(algorithm) if algorithm is not None and privacy.enabled else []
        #: the uploads besides the weights the robust rule takes (Upload.robust: fedray.aggregation.robust.robust_sum)
        self.robust_parts = robust_parts(algorithm) if algorithm is not None and config.robust.rule != "none" else []
        self.released_parts = released_parts(algorithm) if algorithm is not None and privacy.enabled else 1
        self.population = population_size(config)
        #: m, the fixed denominator of the central mean and the robust rules' n: train.clients_per_round, or K under train.mode=async
        self.cohort = aggregated_cohort(config)
        #: train.mode=async accounts each aggregation at q = 1: arrivals follow the clock, not a uniform sample
        self.buffered = config.train.mode == "async"
        secagg = privacy.secure_aggregation
        self.secagg_threshold = survivor_threshold(secagg, config.train.clients_per_round) if secagg.enabled else 0
        #: the clients add the central noise in shares (privacy.secure_aggregation.noise: distributed)
        self.distributed = distributed_noise(config)
        self.delta = privacy.delta if privacy.delta is not None else default_delta(self.population)
        self.noise_multiplier = privacy.noise_multiplier
        #: distributed noise: the smallest multiplier a round's sum has carried so far (dropped clients'
        #: shares are missing), which every round is accounted at (None: z itself)
        self.least_realised: float | None = None
        self.clip = privacy.clip  # C of the next round: fixed, or adaptive clipping's current bound
        self.rounds_accounted = 0
        self.participations = np.zeros(config.data.num_clients, dtype=np.int64)  # local DP: releases per client
        self.accountant: CentralAccountant | None = None
        self.audit: CanaryAudit | None = None  # privacy.audit: canaries in the central sum (fedray.privacy.audit)
        if privacy.audit.enabled:
            from fedray.privacy.audit import CanaryAudit

            self.audit = CanaryAudit(config, noise_cohort_size(config) / self.population, self.delta)
        if privacy.enabled:
            try:
                from fedray.privacy.accountant import CentralAccountant
            except ImportError as error:
                raise RunError(f"privacy.mechanism needs the dp-accounting library ({error}); pip install 'fedray[privacy]'") from None
            sampled_from = self.cohort if self.buffered else self.population  # async: q = K/K = 1, no amplification
            self.accountant = CentralAccountant(privacy.accountant, privacy.sampling, sampled_from, noise_cohort_size(config), self.delta)
            if self.delta >= 1 / self.population:
                logger.warning("privacy.delta %g is >= 1/population (1/%d): the guarantee is weak", self.delta, self.population)
            if self.noise_multiplier is None:
                assert privacy.target_epsilon is not None  # PrivacyConfig's validator
                self.noise_multiplier = self.accountant.noise_multiplier_for(privacy.target_epsilon, config.train.rounds)
            if privacy.clipping == "adaptive":  # a calibrated z is checked here, a given one with the config
                problem = adaptive_noise_problem(self.noise_multiplier, clipped_count_stddev(config))
                if problem is not None:
                    raise ConfigError(None, problem)
                logger.info(
                    "privacy: adaptive clipping from C=%g towards the %g-quantile of the update norms (η_C=%g, σ_b=%g); "
                    "each part's noise multiplier is √P·z_Δ=%.4g",
                    privacy.clip,
                    privacy.target_quantile,
                    privacy.clip_lr,
                    clipped_count_stddev(config),
                    self.update_noise_multiplier,
                )
            logger.info(
                "privacy: %s DP, clip C=%g%s, noise multiplier z=%.4g (each of %d parts √P·z=%.4g), δ=%g, %s accountant, %s sampling q=%d/%d",
                privacy.mechanism,
                privacy.clip,
                "".join(f", {part.bound}={getattr(privacy, part.bound):g}" for part in self.parts),
                self.noise_multiplier,
                self.released_parts,
                self.update_noise_multiplier,
                self.delta,
                privacy.accountant,
                privacy.sampling,
                noise_cohort_size(config),
                sampled_from,
            )
            if self.buffered and privacy.mechanism == "central":
                logger.info(
                    "privacy: train.mode=async: each aggregation of K=%d buffered updates is one Gaussian mechanism of multiplier z "
                    "(noise z·C on the buffer's sum, divided by K), composed over the aggregations at q=1 without amplification by "
                    "sampling (who arrives depends on the clock and availability, not on a uniform sample)",
                    self.cohort,
                )
        if config.robust.collects_updates:
            logger.info(
                "robust.rule=%s, robust.attack=%s: the workers collect each client's update instead of summing them",
                config.robust.rule,
                config.robust.attack if config.robust.attacking else "(no attackers)",
            )

    @classmethod
    def for_run(cls, config: RunConfig, algorithm: Algorithm) -> "ServerUploadPath | None":
        return cls(config, algorithm) if upload_path_enabled(config) or config.privacy.secure_aggregation.enabled else None

    @property
    def update_noise_multiplier(self) -> float:
        """The multiplier of the noise on the sum of updates and on every other released part: z, or
        z_Δ under adaptive clipping (:func:`fedray.privacy.mechanisms.update_noise_multiplier`), times
        √P for P released parts (:func:`fedray.privacy.mechanisms.part_noise_multiplier`)."""
        z = self.noise_multiplier or 0.0
        if self.config.privacy.clipping == "adaptive":
            z = update_noise_multiplier(z, clipped_count_stddev(self.config))
        return part_noise_multiplier(z, self.released_parts)

    def broadcast(self, broadcast: dict[str, Any]) -> dict[str, Any]:
        """The algorithm's ``broadcast``, with the round's clip bound under adaptive clipping (the
        workers clip to it; the engine calls this on every broadcast it sends)."""
        if self.config.privacy.clipping != "adaptive":
            return broadcast
        return {**broadcast, ADAPTIVE_CLIP: torch.tensor(self.clip, dtype=torch.float64)}

    def check_budget(self, round: int) -> None:
        """Raise :class:`PrivacyBudgetExhausted` if training ``round`` would exceed ``privacy.target_epsilon``."""
        privacy = self.config.privacy
        if privacy.mechanism != "central" or privacy.target_epsilon is None or self.accountant is None or self.noise_multiplier is None:
            return
        epsilon = self.accountant.epsilon(self.accounted_multiplier, self.rounds_accounted + 1)
        if epsilon > privacy.target_epsilon * (1 + 1e-9):  # calibration meets the target only to a tolerance
            raise PrivacyBudgetExhausted(
                f"round {round} would spend ε = {epsilon:.4g} > privacy.target_epsilon = {privacy.target_epsilon:g} "
                f"(δ = {self.delta:g}); the run stops after round {round - 1}; raise the target, the noise multiplier or lower train.rounds"
            )

    def apply(self, round: int, results: RoundResults, reference: torch.Tensor) -> tuple[RoundResults, dict[str, float]]:
        """``results`` with the weights' sums rewritten as the module docstring says, and the row's
        privacy/robustness columns."""
        privacy, robust = self.config.privacy, self.config.robust
        sums, payloads, client_metrics = dict(results.sums), results.payloads, results.client_metrics
        row: dict[str, float] = {}
        if privacy.secure_aggregation.enabled:
            row["secagg_failed"] = float(results.num_clients < self.secagg_threshold)
            if row["secagg_failed"]:  # the sum stays masked: nothing is aggregated or accounted (0 clients)
                logger.warning(
                    "round %d: %d client(s) reported, below privacy.secure_aggregation's threshold t=%d: the round fails, "
                    "the model is unchanged",
                    round,
                    results.num_clients,
                    self.secagg_threshold,
                )
                return RoundResults(results.sums, payloads, client_metrics, 0, results.excluded_clients), row
            if self.distributed and results.num_clients > 0:
                realised = realised_noise_multiplier(self.noise_multiplier or 0.0, results.num_clients, self.config.train.clients_per_round)
                row["secagg_noise_multiplier"] = realised
                self.least_realised = realised if self.least_realised is None else min(self.least_realised, realised)
        if robust.attacking:
            row["malicious_clients"] = float(sum(m.get("malicious", 0.0) for m in client_metrics.values()))
        if results.num_clients > 0:
            reference = reference.to(torch.float64)
            if robust.collects_updates:
                clients = list(payloads)
                updates = torch.stack([payloads[cid].pop(ROBUST_UPDATE).to(torch.float64) for cid in clients])
                if robust.attack == "alie" and robust.attacking:
                    updates, row["alie_z"] = self._alie(updates, [client_metrics[cid].get("malicious", 0.0) > 0 for cid in clients])
                if robust.rule == "none":  # ALIE under the weighted mean: Σ n_k·Δ_k / Σ n_k
                    weights = torch.stack([payloads[cid].pop(ROBUST_WEIGHT).to(updates.device, torch.float64) for cid in clients])
                    aggregate = (weights[:, None] * updates).sum(dim=0) / weights.sum()
                else:
                    aggregate = robust_aggregate(robust.rule, updates, robust.trim_fraction, robust.krum_f, robust.multi_krum_m)
                    for sum_key, count_key in self.robust_parts:
                        sums.update(self._robust_part([payloads[cid] for cid in clients], sum_key, count_key))
                payloads = {cid: payload for cid, payload in payloads.items() if payload}
                sums["weights"], sums["num_samples"] = reference + aggregate, torch.tensor(1.0, dtype=torch.float64)
            elif privacy.mechanism == "central":
                cohort = self.cohort
                std = central_noise_std(self.update_noise_multiplier, self.clip, cohort, noise_cohort_size(self.config))
                noise = central_noise(self.config.seed, round, sums["weights"], std) if std > 0 and not self.distributed else 0.0
                if self.audit is not None:  # privacy.audit: the round's canaries join the clipped sum before the noise
                    sums["weights"] = sums["weights"] + self.audit.canary_sum(round, self.clip, sums["weights"])
                    row.update(self.audit.record(sums["weights"] + noise))  # the release, scored
                sums["weights"] = cohort * reference + sums["weights"] + noise
                sums["num_samples"] = torch.tensor(float(cohort), dtype=torch.float64)
            elif privacy.mechanism == "local":
                count = float(sums["num_samples"])
                sums["weights"] = count * reference + sums["weights"]
            if privacy.mechanism == "central" and self.parts:
                payloads = self._noise_parts(round, sums, payloads)
        if privacy.enabled:
            norms = [m["update_norm"] for m in client_metrics.values() if "update_norm" in m]
            if norms:
                row["dp_clipped_fraction"] = float(np.mean([norm > self.clip for norm in norms]))
            if privacy.clipping == "adaptive":
                row["dp_clip"] = self.clip
                self.clip = self._next_clip(round, norms)
            row.update(self._account(client_metrics))
            if self.audit is not None and "audit_epsilon_lower_bound" in row and round == self.config.train.rounds:
                from fedray.privacy.audit import summary_line

                logger.info("%s", summary_line(row, privacy.audit.confidence))
        results = RoundResults(sums, payloads, client_metrics, results.num_clients, results.excluded_clients)
        return results, row

    def apply_buffer(
        self, round: int, groups: list[tuple[RoundResults, float, torch.Tensor]], current: torch.Tensor
    ) -> tuple[RoundResults, dict[str, float]]:
        """:meth:`apply` on one aggregation of ``train.mode: async`` (docs/guide/privacy.md, "Asynchronous
        aggregation"). ``groups``: per model version v the buffer's clients started from, their merged
        results, their staleness weight s(τ) ≤ 1 and w_v; ``current``: w, the weights being updated.

        Each client's update Δ_k was formed on its worker against w_{v_k} (clipped, and noised under
        local DP). The buffer is rewritten as one round's results against w, then :meth:`apply` runs on
        them as on a synchronous round of m = K = ``systems.fedbuff.buffer_size`` clients:

        - central DP: w + (Σ_k s(τ_k)·(clip(Δ_k) + p_k) + N(0, (z·C)²)) / K, one noise draw on the
          buffer's sum, the fixed denominator K even for a buffer that closed with fewer updates;
        - local DP: w + Σ_k s(τ_k)·(clip(Δ_k) + N(0, (z·C)²) + p_k) / k over the k updates received;
        - a robust rule: w + rule([s(τ_k)·(Δ_k + p_k)]) over the buffer's updates (ALIE then replaces the
          malicious ones among these);

        with p_k = w_{v_k} − w under ``systems.fedbuff.mixing: model`` (FedAsync: public, not clipped)
        and 0 under ``delta``. Attackers without a rule or privacy leave the plain weighted sums,
        combined by :func:`~fedray.systems.fedbuff.buffered_results`. A client is in a buffer once at most
        (:class:`~fedray.systems.fedbuff.BufferSchedule`), which bounds one client's change of the sum by C."""
        mixing = self.config.systems.fedbuff.mixing
        clients = [cid for results, _, _ in groups for cid in results.client_metrics]
        if len(clients) != len(set(clients)):
            raise RuntimeError(
                f"round {round}: a client contributes twice to one buffer ({sorted(clients)}); the sensitivity C assumes once"
            )
        if not (self.config.privacy.enabled or self.config.robust.collects_updates):
            return self.apply(round, buffered_results(groups, current, mixing), current)
        reference = current.to(torch.float64)
        summed: torch.Tensor | None = None  # Σ_g s_g·(Σ_{k in g} Δ_k + k_g·p_g): the buffer's deltas against w
        count = torch.zeros((), dtype=torch.float64)
        for results, weight, start in groups:
            if results.num_clients == 0:
                continue
            public = start.to(reference.device, torch.float64) - reference if mixing == "model" else None
            for payload in results.payloads.values():
                if ROBUST_UPDATE in payload:  # each client's delta, for the rule
                    update = payload[ROBUST_UPDATE].to(torch.float64)
                    payload[ROBUST_UPDATE] = float(weight) * (update if public is None else update + public)
            if "weights" in results.sums:  # the group's sum of deltas and its count of clients (ones each)
                term = results.sums["weights"].to(torch.float64)
                if public is not None:
                    term = term + results.sums["num_samples"] * public
                summed = float(weight) * term if summed is None else summed + float(weight) * term
                count = count + results.sums["num_samples"]
        sums = {"weights": summed, "num_samples": count} if summed is not None else {}
        return self.apply(round, RoundResults.merged([results for results, _, _ in groups], sums), current)

    def _robust_part(self, payloads: list[dict[str, Any]], sum_key: str, count_key: str) -> dict[str, torch.Tensor]:
        """The sums of one upload besides the weights under the robust rule, from each client's copy
        (popped from ``payloads``): :func:`fedray.aggregation.robust.robust_sum`."""
        robust = self.config.robust
        values = torch.stack([payload.pop(f"{ROBUST_UPDATE}:{sum_key}") for payload in payloads])
        counts = torch.stack([payload.pop(f"{ROBUST_UPDATE}:{count_key}") for payload in payloads]) if count_key else None
        total, total_counts = robust_sum(
            robust.rule,
            values.double(),
            None if counts is None else counts.double(),
            robust.trim_fraction,
            robust.krum_f,
            robust.multi_krum_m,
        )
        if counts is None or total_counts is None:
            return {sum_key: total.to(values.dtype)}
        return {sum_key: total.to(values.dtype), count_key: total_counts.to(counts.dtype)}

    def _alie(self, updates: torch.Tensor, malicious: list[bool]) -> tuple[torch.Tensor, float]:
        """ALIE (:func:`fedray.aggregation.attacks.alie_updates`): the malicious rows of ``updates``
        replaced by μ − z·σ of the benign ones, and the z used (nan in a round without attackers)."""
        mask = torch.tensor(malicious, dtype=torch.bool, device=updates.device)
        m = int(mask.sum())
        if m == 0:
            return updates, float("nan")
        z = self.config.robust.alie_z if self.config.robust.alie_z is not None else alie_z(updates.shape[0], m)
        return alie_updates(updates, mask, z), z

    def _noise_parts(self, round: int, sums: dict[str, Any], payloads: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """Central DP on the parts other than the weights (module docstring): noise on each summed
        part's sum (in place) and on each client's copy of a per-client part; the payloads returned
        under anonymous keys in a seeded random order when any part is per client."""
        privacy, cohort = self.config.privacy, self.cohort
        multiplier = self.update_noise_multiplier
        for index, part in enumerate(self.parts, start=1):
            bound = getattr(privacy, part.bound)
            if part.travels_in == "sums":
                std = central_noise_std(multiplier, bound, cohort, noise_cohort_size(self.config))
                if std > 0 and not self.distributed:  # distributed: the clients' shares are in the sum already
                    sums[part.key] = sums[part.key] + central_noise(self.config.seed, round, sums[part.key], std, index)
            elif multiplier > 0:
                for client_id, payload in payloads.items():
                    value = payload[part.key]
                    noise = local_noise(self.config.seed, round, client_id, value, multiplier * bound, index)
                    payload[part.key] = (value.double() + noise).to(value.dtype)
        if not any(part.travels_in == "payload" for part in self.parts):
            return payloads
        order = np.random.default_rng(derive_seed(self.config.seed, ANONYMOUS_ORDER_STREAM, round)).permutation(sorted(payloads))
        return {slot: payloads[int(client_id)] for slot, client_id in enumerate(order)}

    def _next_clip(self, round: int, norms: list[float]) -> float:
        """Adaptive clipping (Andrew et al. 2021, Alg. 1): b̃ = (Σ_k 1[‖Δ_k‖ ≤ C] + N(0, (σ_b·m/M)²)) / m,
        the noise scaled for the emulated cohort M as the update's is, then the geometric update."""
        privacy, cohort = self.config.privacy, self.config.train.clients_per_round
        count_std = clipped_count_stddev(self.config) * cohort / noise_cohort_size(self.config)
        unclipped = sum(norm <= self.clip for norm in norms) + clipped_count_noise(self.config.seed, round, count_std)
        return next_adaptive_clip(self.clip, unclipped / cohort, privacy.target_quantile, privacy.clip_lr)

    @property
    def accounted_multiplier(self) -> float:
        """The z every round of central DP is accounted at: ``privacy.noise_multiplier`` (or the
        calibrated one), or with distributed noise the smallest realised z·√(n/m) so far. A Gaussian
        of more noise is dominated by one of less (Poisson or fixed-size subsampling keeps that), so
        composing every round at the smallest is an upper bound on ε, never below the truth."""
        assert self.noise_multiplier is not None
        return self.noise_multiplier if self.least_realised is None else min(self.noise_multiplier, self.least_realised)

    def _account(self, client_metrics: dict[int, dict[str, float]]) -> dict[str, float]:
        """ε spent so far, after this round's release; local DP also each participant's own ε."""
        from fedray.privacy.accountant import local_epsilon

        privacy = self.config.privacy
        assert self.accountant is not None and self.noise_multiplier is not None
        if privacy.mechanism == "central":
            self.rounds_accounted += 1
            return {
                "dp_epsilon": self.accountant.epsilon(self.accounted_multiplier, self.rounds_accounted),
                "dp_noise_multiplier": self.accounted_multiplier,
            }
        clients = np.fromiter(client_metrics, dtype=np.int64)
        self.participations[clients] += 1
        for cid in clients:
            client_metrics[int(cid)]["dp_epsilon"] = local_epsilon(
                self.noise_multiplier, int(self.participations[cid]), self.delta, privacy.accountant
            )
        most = int(self.participations.max())
        return {
            "dp_epsilon": local_epsilon(self.noise_multiplier, most, self.delta, privacy.accountant),
            "dp_noise_multiplier": self.noise_multiplier,
        }

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The accountant's history (rounds composed, each client's releases), the calibrated z and
        the next round's clip bound (the noise is drawn from (seed, round): it has no state)."""
        return {
            "rounds_accounted": self.rounds_accounted,
            "participations": torch.from_numpy(self.participations.copy()),
            "noise_multiplier": self.noise_multiplier,
            **({"least_realised": self.least_realised} if self.least_realised is not None else {}),
            "clip": self.clip,
            **({"audit": self.audit.state_dict()} if self.audit is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds_accounted = int(state["rounds_accounted"])
        self.participations = state["participations"].numpy().astype(np.int64)
        self.noise_multiplier = state["noise_multiplier"]
        self.least_realised = state.get("least_realised")
        self.clip = float(state.get("clip", self.config.privacy.clip))  # checkpoints from before adaptive clipping
        if self.audit is not None and "audit" in state:
            self.audit.load_state_dict(state["audit"])
