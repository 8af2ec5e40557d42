"""The privacy accountant: (ε, δ) of the rounds released so far, from Google's ``dp-accounting``.

Why dp-accounting rather than Opacus's accountants: it is a small pure-Python library with no
dependence on a training framework, it composes arbitrary DP events (Poisson and fixed-size
sampling, the Gaussian mechanism, self-composition), and it offers both Rényi DP (Mironov 2017;
Wang et al. 2019 for sampling without replacement) and privacy-loss-distribution accounting
(``privacy.accountant: rdp | pld``) behind one interface, plus the calibration of a noise
multiplier to a target ε. Opacus's accountants assume per-sample DP-SGD on its own engine.

One round of central DP is one event: the Gaussian mechanism with noise multiplier z on a sampled
cohort, q = M / N (M = ``privacy.noise_cohort_size`` or ``train.clients_per_round``, N =
``privacy.population_size`` or ``data.num_clients``):

- ``privacy.sampling: poisson``: ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``, add/remove
  neighbours (McMahan et al., ICLR 2018, Thm. 1 with the moments accountant);
- ``fixed_size``: ``SampledWithoutReplacementDpEvent(N, M, GaussianDpEvent(z / 2))``: the draw fedray
  makes, whose neighbours replace one client, so the clipped sum moves by up to 2C.

Under ``train.mode: async`` (FedBuff) one aggregation of K = ``systems.fedbuff.buffer_size`` buffered
updates is one event at q = K/K = 1 (``poisson``: ``GaussianDpEvent(z)`` composed over the aggregations,
add/remove of one client's update from a buffer, sensitivity C), without amplification by sampling:
who arrives in a buffer depends on the simulated clock and availability, not on a uniform sample
(:meth:`fedray.runtime.upload_path.ServerUploadPath.apply_buffer`).

Adaptive clipping (``privacy.clipping: adaptive``) releases a noised count of unclipped updates
besides the sum; with the update's multiplier z_Δ of :func:`fedray.privacy.mechanisms.update_noise_multiplier`
the two together are one Gaussian mechanism of multiplier z (Andrew et al., NeurIPS 2021, Thm. 1),
so the round is still the event above with z.

Every upload kind of a client (weights, prototypes, counts, ...: P parts) is clipped to its own bound
and noised with multiplier √P·z, which together is one Gaussian mechanism of multiplier z
(:mod:`fedray.privacy.mechanisms`), so the round is the event above: one ε for everything a client
reveals. A per-client part (FedSC's prototypes) changes one anonymous entry by at most 2C when one
client's data is replaced, the relation of ``fixed_size``, which central DP then requires. Local DP: each participation of a client is ``GaussianDpEvent(z / 2)``
(its clipped delta can be replaced by any other of norm ≤ C) without amplification by sampling,
composed over that client's participations.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from functools import cache
from typing import Iterator, Literal

import dp_accounting
from dp_accounting import pld, rdp

AccountantName = Literal["rdp", "pld"]
Sampling = Literal["poisson", "fixed_size"]


def make_accountant(name: AccountantName, sampling: Sampling = "poisson") -> dp_accounting.PrivacyAccountant:
    """A fresh dp-accounting accountant for ``name`` whose neighbouring relation suits ``sampling``."""
    relation = (
        dp_accounting.NeighboringRelation.REPLACE_ONE if sampling == "fixed_size" else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    if name == "pld":
        return pld.PLDAccountant(neighboring_relation=relation)
    return rdp.RdpAccountant(neighboring_relation=relation)


def central_round_event(noise_multiplier: float, population: int, cohort: int, sampling: Sampling) -> dp_accounting.DpEvent:
    """One round of central DP (module docstring)."""
    if sampling == "fixed_size":
        return dp_accounting.SampledWithoutReplacementDpEvent(population, cohort, dp_accounting.GaussianDpEvent(noise_multiplier / 2))
    return dp_accounting.PoissonSampledDpEvent(cohort / population, dp_accounting.GaussianDpEvent(noise_multiplier))


@contextmanager
def _quiet_absl() -> Iterator[None]:
    """dp-accounting logs a warning for every Rényi order whose series does not converge; that order
    is left out, which only makes ε larger (safe), so the warnings are noise in a run's log."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl.setLevel(level)


@cache  # the server's budget check before round r and round r's dp_epsilon ask for the same value
def epsilon_of(event: dp_accounting.DpEvent, count: int, delta: float, name: AccountantName, sampling: Sampling = "poisson") -> float:
    """ε of ``event`` composed ``count`` times, at ``delta``."""
    if count == 0:
        return 0.0
    accountant = make_accountant(name, sampling)
    with _quiet_absl():
        accountant.compose(event, count)
        return float(accountant.get_epsilon(delta))


class CentralAccountant:
    """ε after each round of central DP: ``epsilon(rounds)``, or the z that reaches a target ε."""

    def __init__(self, name: AccountantName, sampling: Sampling, population: int, cohort: int, delta: float) -> None:
        self.name, self.sampling, self.population, self.cohort, self.delta = name, sampling, population, cohort, delta

    def event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        return central_round_event(noise_multiplier, self.population, self.cohort, self.sampling)

    def epsilon(self, noise_multiplier: float, rounds: int) -> float:
        """ε after ``rounds`` rounds with noise multiplier z (inf for z = 0)."""
        if rounds > 0 and noise_multiplier == 0:
            return float("inf")
        return epsilon_of(self.event(noise_multiplier), rounds, self.delta, self.name, self.sampling)

    def noise_multiplier_for(self, target_epsilon: float, rounds: int) -> float:
        """The smallest z (to dp-accounting's tolerance) whose ``rounds`` rounds spend at most ``target_epsilon``."""
        return calibrated_noise_multiplier(self.name, self.sampling, self.population, self.cohort, self.delta, target_epsilon, rounds)


@cache  # a run calibrates before Ray starts (the config check) and again when its server starts: seconds each
def calibrated_noise_multiplier(
    name: AccountantName, sampling: Sampling, population: int, cohort: int, delta: float, target_epsilon: float, rounds: int
) -> float:
    """:meth:`CentralAccountant.noise_multiplier_for`, computed once per process for the same arguments."""
    # dp-accounting's search starts at z = 0, where its sampling-without-replacement RDP divides by
    # z²; below 0.01 no target ε of any use is met, so the search starts there for fixed_size
    bracket = dp_accounting.LowerEndpointAndGuess(0.01, 1.0) if sampling == "fixed_size" else None
    with _quiet_absl():
        return float(
            dp_accounting.calibrate_dp_mechanism(
                lambda: make_accountant(name, sampling),
                lambda z: dp_accounting.SelfComposedDpEvent(central_round_event(z, population, cohort, sampling), rounds),
                target_epsilon,
                delta,
                bracket_interval=bracket,
            )
        )


@cache  # the same few (z, count) pairs recur every round
def local_epsilon(noise_multiplier: float, participations: int, delta: float, name: AccountantName) -> float:
    """One client's ε under local DP after ``participations`` releases (module docstring)."""
    if participations > 0 and noise_multiplier == 0:
        return float("inf")
    # z / 2 carries the replace-one sensitivity 2C, so the accountant's own relation does not matter here
    return epsilon_of(dp_accounting.GaussianDpEvent(noise_multiplier / 2), participations, delta, name)
