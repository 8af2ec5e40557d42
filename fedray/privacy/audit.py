"""An empirical privacy audit of a central-DP run from that one run (``privacy.audit``,
docs/guide/privacy.md, 'Auditing a run empirically'): Steinke, Nasr and Jagielski, "Privacy Auditing
with One (1) Training Run", NeurIPS 2023.

The setting is the paper's white-box audit of DP-SGD with canary gradients, with a client in place of
an example. m canaries are fixed random directions u_i of norm C (``privacy.clip``, the round's bound
under adaptive clipping) in the flat update space, drawn from the run's seed; each canary is "in"
(S_i = +1) with probability ½, independently, else "out" (S_i = −1). An "in" canary is one more
clipped client of the population: in each round it joins the cohort with the accountant's sampling
probability q = M/N (``privacy.noise_cohort_size`` or ``train.clients_per_round`` over
``privacy.population_size`` or ``data.num_clients``; Poisson sampling, as the accountant assumes), and
its u_i is added to the round's clipped sum before the central noise, exactly where a client's
clipped delta goes. An "in" canary that joined every round would not get the amplification by
sampling that the accountant's ε credits, and the audit would then bound a different mechanism.

After each round the canaries are scored against everything released so far, the sum R of the
rounds' noisy sums (what the server adds to cohort·w before dividing by the cohort, so R is
cohort·(final − initial weights) for FedAvg without a server optimizer): score_i = ⟨R, u_i⟩/C. The k
highest scores are guessed "in", the k lowest "out" (``privacy.audit.guesses``; r = 2k guesses), and
v of them are correct. If the run is (ε, δ)-DP with respect to each canary, then (Theorem 3.1 of
the paper, its main result):

    P[v ≥ v₀] ≤ β(ε) + 2·m·δ·α(ε),   β = P[W ≥ v₀],   α = max_{i=1..v₀} P[v₀ − i ≤ W < v₀] / i,
    W ~ Binomial(r, e^ε / (1 + e^ε)),

so the ε whose p-value equals 1 − confidence is a lower bound on the run's ε with that confidence
(:func:`epsilon_lower_bound`, ``privacy.audit.confidence``, 0.95 by default). A correct
implementation gives a bound below the accountant's ε; a bound above it, at the confidence stated,
means the run leaks more than it claims (or the claim's assumptions are not those of the run).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from scipy import optimize, stats

from fedray.seeding import derive_seed

if TYPE_CHECKING:
    from fedray.config import RunConfig

logger = logging.getLogger(__name__)

AUDIT_DIRECTION_STREAM = 4410  # derive_seed streams, distinct from fedray.privacy.mechanisms' and fedray.aggregation.attacks'
AUDIT_MEMBERSHIP_STREAM = 4411
AUDIT_SAMPLING_STREAM = 4412


def p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """P[at least ``correct`` of ``guesses`` guesses are right] for ``canaries`` canaries if the run is
    (ε, δ)-DP with respect to each (module docstring: β + 2mδ·α, Steinke et al. 2023, Thm. 3.1)."""
    if not 0 <= correct <= guesses <= canaries:
        raise ValueError(f"need 0 <= correct ({correct}) <= guesses ({guesses}) <= canaries ({canaries})")
    q = 1 / (1 + math.exp(-epsilon))  # the accuracy of ε-DP randomized response
    beta = float(stats.binom.sf(correct - 1, guesses, q))  # P[W >= v]
    if correct == 0 or delta == 0:
        return min(beta, 1.0)
    below = stats.binom.pmf(np.arange(correct - 1, -1, -1), guesses, q)  # P[W = v − i], i = 1..v
    alpha = float(np.max(np.cumsum(below) / np.arange(1, correct + 1)))  # max_i P[v − i <= W < v] / i
    return min(beta + 2 * canaries * delta * alpha, 1.0)


def epsilon_lower_bound(canaries: int, guesses: int, correct: int, delta: float, confidence: float = 0.95) -> float:
    """The largest ε that ``correct`` right guesses of ``guesses`` reject at ``confidence``: the run is
    not (ε', δ)-DP for any ε' below it, except with probability 1 − confidence (0 when nothing is rejected)."""
    threshold = 1 - confidence
    if p_value(canaries, guesses, correct, 0.0, delta) >= threshold:
        return 0.0
    high = 1.0
    while p_value(canaries, guesses, correct, high, delta) < threshold:  # p grows with ε
        high *= 2
        if high > 1e3:
            return math.inf
    return float(optimize.brentq(lambda eps: p_value(canaries, guesses, correct, eps, delta) - threshold, 0.0, high, xtol=1e-6))


def membership(seed: int, canaries: int) -> np.ndarray:
    """S: which canaries are "in" (True), each with probability ½, from the run's seed."""
    return np.random.default_rng(derive_seed(seed, AUDIT_MEMBERSHIP_STREAM)).random(canaries) < 0.5


def directions(seed: int, canaries: int, dim: int) -> torch.Tensor:
    """The canaries' unit directions u_i/C, one row each ([canaries, dim], float32), from the run's seed."""
    generator = torch.Generator().manual_seed(derive_seed(seed, AUDIT_DIRECTION_STREAM))
    rows = torch.randn(canaries, dim, generator=generator, dtype=torch.float32)
    return rows / rows.norm(dim=1, keepdim=True)


def guesses_and_correct(scores: np.ndarray, included: np.ndarray, per_side: int) -> tuple[int, int]:
    """r = 2k guesses (the k highest scores "in", the k lowest "out") and how many of them are right."""
    order = np.argsort(scores, kind="stable")
    correct = int(np.sum(~included[order[:per_side]])) + int(np.sum(included[order[len(order) - per_side :]]))
    return 2 * per_side, correct


class CanaryAudit:
    """The server's audit state: the canaries, which are in, and the sum of the rounds' releases."""

    def __init__(self, config: RunConfig, sampling_rate: float, delta: float) -> None:
        audit = config.privacy.audit
        self.seed, self.canaries, self.per_side, self.confidence = config.seed, audit.canaries, audit.per_side, audit.confidence
        self.sampling_rate, self.delta = sampling_rate, delta
        self.included = membership(self.seed, self.canaries)
        self.units: torch.Tensor | None = None  # drawn at the first round, when the update's size is known
        self.released: torch.Tensor | None = None  # R: the sum of the rounds' noisy sums (float64)
        self.last: dict[str, float] = {}

    def _directions(self, like: torch.Tensor) -> torch.Tensor:
        if self.units is None or self.units.shape[1] != like.numel():
            self.units = directions(self.seed, self.canaries, like.numel()).to(like.device)
        return self.units

    def joined(self, round: int) -> np.ndarray:
        """Which canaries join ``round``: the "in" ones, each with the sampling probability q."""
        sampled = np.random.default_rng(derive_seed(self.seed, AUDIT_SAMPLING_STREAM, round)).random(self.canaries) < self.sampling_rate
        return self.included & sampled

    def canary_sum(self, round: int, clip: float, like: torch.Tensor) -> torch.Tensor:
        """Σ u_i over the canaries that join ``round``, each of norm ``clip`` (float64, ``like``'s shape and device)."""
        units = self._directions(like)
        index = torch.from_numpy(np.flatnonzero(self.joined(round))).to(units.device)
        total = units.index_select(0, index).double().sum(dim=0) * clip
        return total.reshape(like.shape)

    def record(self, released: torch.Tensor) -> dict[str, float]:
        """Add the round's released noisy sum to R; the audit's columns for the round's row."""
        flat = released.detach().reshape(-1).to(torch.float64)
        self.released = flat.clone() if self.released is None else self.released + flat
        units = self._directions(flat)
        scores = (units.double() @ self.released).cpu().numpy()
        guesses, correct = guesses_and_correct(scores, self.included, self.per_side)
        self.last = {
            "audit_epsilon_lower_bound": epsilon_lower_bound(self.canaries, guesses, correct, self.delta, self.confidence),
            "audit_correct_guesses": float(correct),
            "audit_guesses": float(guesses),
            "audit_canaries": float(self.canaries),
        }
        return dict(self.last)

    def state_dict(self) -> dict[str, Any]:
        return {"released": None if self.released is None else self.released.cpu()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.released = None if state.get("released") is None else state["released"].to(torch.float64)


def summary_line(row: dict[str, float], confidence: float) -> str:
    """The run's closing line: the audit's bound next to the accountant's ε."""
    accountant = row.get("dp_epsilon", math.nan)
    return (
        f"privacy audit: ε ≥ {row['audit_epsilon_lower_bound']:.3g} with {confidence:.0%} confidence "
        f"({int(row['audit_correct_guesses'])} of {int(row['audit_guesses'])} guesses right, "
        f"{int(row['audit_canaries'])} canaries); the accountant's ε = {accountant:.4g}"
    )
