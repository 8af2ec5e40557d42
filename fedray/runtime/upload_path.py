"""The upload path between a client's update and the algorithm's ``aggregate`` (docs/guide/privacy.md):
attack (simulated malicious clients) → clipping → local noise → worker pre-aggregation → central
noise on the sum → the aggregation rule (weighted mean, or a robust rule over per-client updates).

It applies to :data:`~fedray.algorithms.uploads.MODEL_WEIGHTS`, the only upload kind it handles (others
are refused before Ray starts, :func:`~fedray.algorithms.uploads.check_uploads`). A client's update is
its delta Δ_k = w_k − w against the broadcast weights w. The path rewrites the two sums so that the
algorithm's own ``sums["weights"] / sums["num_samples"]`` (and any server optimizer after it) yields:

- central DP: w + (Σ_k clip(Δ_k) + N(0, σ²)) / m, σ = z·C·m/M, m = ``train.clients_per_round`` (the
  fixed denominator of DP-FedAvg, uniform client weights; :mod:`fedray.privacy.mechanisms`);
- local DP: w + Σ_k (clip(Δ_k) + N(0, (z·C)²)) / k over the k aggregated clients;
- a robust rule: w + rule([Δ_k]) over the clients' individual deltas, which the workers then collect as
  ``payload`` instead of summing them.

Nothing here runs when ``privacy`` and ``robust`` are off (the engine and worker hold ``None``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedray.aggregation.attacks import attacked_delta, malicious_clients
from fedray.aggregation.robust import robust_aggregate
from fedray.algorithms import Algorithm, ClientUpdate, RoundResults
from fedray.algorithms.uploads import undeclared_keys
from fedray.config import RunConfig
from fedray.config.privacy import default_delta, noise_cohort_size, population_size
from fedray.privacy.clipping import clip_to_norm
from fedray.privacy.mechanisms import central_noise, central_noise_std, local_noise
from fedray.runtime.errors import RunError

if TYPE_CHECKING:  # dp-accounting is the optional extra `privacy`: imported only when privacy is on
    from fedray.privacy.accountant import CentralAccountant

logger = logging.getLogger(__name__)

#: The payload key under which a client's delta travels when a robust rule needs it alone.
ROBUST_UPDATE = "robust_update"


class PrivacyBudgetExhausted(RunError):
    """The next round would spend more than ``privacy.target_epsilon``."""

    fedray_exit_code = 3

    def __reduce__(self) -> tuple[type, tuple[str]]:  # Ray pickles it out of the server actor
        return type(self), (str(self),)


def upload_path_enabled(config: RunConfig) -> bool:
    return config.privacy.enabled or config.robust.enabled


class ClientUploadPath:
    """The worker's part, per client: attack, clip, local noise, and the form the update travels in."""

    def __init__(self, config: RunConfig, algorithm: Algorithm, num_clients: int) -> None:
        self.config = config
        self.algorithm_class = type(algorithm)
        self.malicious = malicious_clients(config.seed, num_clients, config.robust.malicious_fraction)

    @classmethod
    def for_run(cls, config: RunConfig, algorithm: Algorithm, num_clients: int) -> "ClientUploadPath | None":
        return cls(config, algorithm, num_clients) if upload_path_enabled(config) else None

    def apply(self, round: int, client_id: int, update: ClientUpdate, broadcast: dict[str, Any]) -> ClientUpdate:
        """``update`` as it leaves the client (a new object; ``update`` is not changed)."""
        undeclared = undeclared_keys(self.algorithm_class, update)
        if undeclared:
            raise TypeError(f"algorithm {self.algorithm_class.name} uploads {', '.join(undeclared)}, which its `uploads` do not declare")
        privacy, robust, seed = self.config.privacy, self.config.robust, self.config.seed
        num_samples = update.sums["num_samples"]
        reference = broadcast["weights"].to(num_samples.device, torch.float64)
        delta = update.sums["weights"].double() / num_samples - reference
        metrics = dict(update.metrics)
        is_malicious = bool(self.malicious[client_id])
        if is_malicious:
            delta = attacked_delta(delta, robust.attack, robust.attack_scale, seed, round, client_id)
            metrics["malicious"] = 1.0
        if privacy.enabled:
            delta, norm = clip_to_norm(delta, privacy.clip)
            metrics["update_norm"] = norm
            if privacy.mechanism == "local" and privacy.noise_multiplier:
                delta = delta + local_noise(seed, round, client_id, delta, privacy.noise_multiplier * privacy.clip)
        sums, payload = dict(update.sums), dict(update.payload)
        if robust.rule != "none":
            del sums["weights"], sums["num_samples"]
            payload[ROBUST_UPDATE] = delta
        elif privacy.enabled:
            sums["weights"], sums["num_samples"] = delta, torch.ones_like(num_samples, dtype=torch.float64)
        elif is_malicious:  # an attack on the plain weighted mean: the client's weight is kept
            sums["weights"] = (reference + delta) * num_samples
        return ClientUpdate(sums=sums, payload=payload, metrics=metrics, state=update.state)


class ServerUploadPath:
    """The server's part: central noise, the robust rule, the accountant and its budget."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        privacy = config.privacy
        self.population = population_size(config)
        self.delta = privacy.delta if privacy.delta is not None else default_delta(self.population)
        self.noise_multiplier = privacy.noise_multiplier
        self.rounds_accounted = 0
        self.participations = np.zeros(config.data.num_clients, dtype=np.int64)  # local DP: releases per client
        self.accountant: CentralAccountant | None = None
        if privacy.enabled:
            try:
                from fedray.privacy.accountant import CentralAccountant
            except ImportError as error:
                raise RunError(f"privacy.mechanism needs the dp-accounting library ({error}); pip install 'fedray[privacy]'") from None
            self.accountant = CentralAccountant(
                privacy.accountant, privacy.sampling, self.population, noise_cohort_size(config), self.delta
            )
            if self.delta >= 1 / self.population:
                logger.warning("privacy.delta %g is >= 1/population (1/%d): the guarantee is weak", self.delta, self.population)
            if self.noise_multiplier is None:
                assert privacy.target_epsilon is not None  # PrivacyConfig's validator
                self.noise_multiplier = self.accountant.noise_multiplier_for(privacy.target_epsilon, config.train.rounds)
            logger.info(
                "privacy: %s DP, clip C=%g, noise multiplier z=%.4g, δ=%g, %s accountant, %s sampling q=%d/%d",
                privacy.mechanism,
                privacy.clip,
                self.noise_multiplier,
                self.delta,
                privacy.accountant,
                privacy.sampling,
                noise_cohort_size(config),
                self.population,
            )
        if config.robust.rule != "none":
            logger.info("robust.rule=%s: the workers collect each client's update instead of summing them", config.robust.rule)

    @classmethod
    def for_run(cls, config: RunConfig) -> "ServerUploadPath | None":
        return cls(config) if upload_path_enabled(config) else None

    def check_budget(self, round: int) -> None:
        """Raise :class:`PrivacyBudgetExhausted` if training ``round`` would exceed ``privacy.target_epsilon``."""
        privacy = self.config.privacy
        if privacy.mechanism != "central" or privacy.target_epsilon is None or self.accountant is None or self.noise_multiplier is None:
            return
        epsilon = self.accountant.epsilon(self.noise_multiplier, self.rounds_accounted + 1)
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
        if robust.malicious_fraction > 0:
            row["malicious_clients"] = float(sum(m.get("malicious", 0.0) for m in client_metrics.values()))
        if results.num_clients > 0:
            reference = reference.to(torch.float64)
            if robust.rule != "none":
                updates = torch.stack([payload.pop(ROBUST_UPDATE).to(torch.float64) for payload in payloads.values()])
                payloads = {cid: payload for cid, payload in payloads.items() if payload}
                aggregate = robust_aggregate(robust.rule, updates, robust.trim_fraction, robust.krum_f, robust.multi_krum_m)
                sums["weights"], sums["num_samples"] = reference + aggregate, torch.tensor(1.0, dtype=torch.float64)
            elif privacy.mechanism == "central":
                cohort = self.config.train.clients_per_round
                std = central_noise_std(self.noise_multiplier or 0.0, privacy.clip, cohort, noise_cohort_size(self.config))
                noise = central_noise(self.config.seed, round, sums["weights"], std) if std > 0 else 0.0
                sums["weights"] = cohort * reference + sums["weights"] + noise
                sums["num_samples"] = torch.tensor(float(cohort), dtype=torch.float64)
            elif privacy.mechanism == "local":
                count = float(sums["num_samples"])
                sums["weights"] = count * reference + sums["weights"]
        if privacy.enabled:
            norms = [m["update_norm"] for m in client_metrics.values() if "update_norm" in m]
            if norms:
                row["dp_clipped_fraction"] = float(np.mean([norm > privacy.clip for norm in norms]))
            row.update(self._account(client_metrics))
        results = RoundResults(sums, payloads, client_metrics, results.num_clients, results.excluded_clients)
        return results, row

    def _account(self, client_metrics: dict[int, dict[str, float]]) -> dict[str, float]:
        """ε spent so far, after this round's release; local DP also each participant's own ε."""
        from fedray.privacy.accountant import local_epsilon

        privacy = self.config.privacy
        assert self.accountant is not None and self.noise_multiplier is not None
        if privacy.mechanism == "central":
            self.rounds_accounted += 1
            return {
                "dp_epsilon": self.accountant.epsilon(self.noise_multiplier, self.rounds_accounted),
                "dp_noise_multiplier": self.noise_multiplier,
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
        """The accountant's history (rounds composed, each client's releases) and the calibrated z."""
        return {
            "rounds_accounted": self.rounds_accounted,
            "participations": torch.from_numpy(self.participations.copy()),
            "noise_multiplier": self.noise_multiplier,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds_accounted = int(state["rounds_accounted"])
        self.participations = state["participations"].numpy().astype(np.int64)
        self.noise_multiplier = state["noise_multiplier"]
