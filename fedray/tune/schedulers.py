"""The sweep's Tune scheduler (``scheduler.type``: ``fifo`` | ``asha`` | ``pbt``) and the callback that
saves its state with Tune's experiment state, so ``fedray tune --resume`` makes the decisions an
uninterrupted sweep makes.

Why the callback: Tune's ``Tuner.restore`` rebuilds the scheduler from ``tuner.pkl``, which is written
once, before the first trial starts; the experiment checkpoints that Tune writes while the sweep runs
hold the trials, the search algorithm and the callbacks' states, but not the scheduler's (Ray 2.60's
``TuneController.save_to_dir``). A resumed ASHA therefore starts with empty rungs: a weak trial that
reaches a rung first after the resume is compared with nobody and survives, and good trials are cut
against the few that reported since. :class:`SchedulerState` is a Tune callback whose state *is* the
scheduler's (``tuner.pkl`` pickles the callback and the scheduler together, so after a restore the
callback still holds the scheduler Tune uses), written in the same experiment checkpoint as the trial
states and set back before Tune re-adds the trials.
"""

from __future__ import annotations

from typing import Any

from ray import tune
from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, PopulationBasedTraining, TrialScheduler

from fedray.tune.spec import Domain, SweepSpec, max_rounds

TIME_ATTR = "round"  # the engine's round, which survives restores (Tune's iteration count restarts)


def make_scheduler(spec: SweepSpec) -> TrialScheduler:
    scheduler = spec.scheduler
    if scheduler.type == "fifo":
        return FIFOScheduler()
    if scheduler.type == "asha":
        return AsyncHyperBandScheduler(
            time_attr=TIME_ATTR,
            max_t=max_rounds(spec),
            grace_period=scheduler.grace_period,
            reduction_factor=scheduler.reduction_factor,
        )
    return PopulationBasedTraining(
        time_attr=TIME_ATTR,
        perturbation_interval=scheduler.perturbation_interval,
        hyperparam_mutations={key: _mutation(domain) for key, domain in spec.space.items()},
        quantile_fraction=scheduler.quantile_fraction,
        resample_probability=scheduler.resample_probability,
        custom_explore_fn=KeepInSpace(spec.space),
        synch=scheduler.synch,
        log_config=False,
    )


def _mutation(domain: Domain) -> Any:
    """PBT's mutation of one key: a ``choice`` shifts to a neighbouring value, a range is multiplied by
    0.8 or 1.2 or resampled (``resample_probability``)."""
    return list(domain.values) if domain.kind == "choice" else domain.to_tune()


class KeepInSpace:
    """PBT's explore step multiplies a value by 0.8 or 1.2 without looking at the domain: clip every
    perturbed value back into its ``[low, high]`` (``randint``: ``[low, high - 1]``, an integer)."""

    def __init__(self, space: dict[str, Domain]) -> None:
        self.space = space

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        for key, domain in self.space.items():
            if domain.kind in ("uniform", "loguniform", "randint"):
                low, high = domain.values
                if domain.kind == "randint":
                    config[key] = int(min(max(round(config[key]), low), high - 1))
                else:
                    config[key] = float(min(max(config[key], low), high))
        return config


class SchedulerState(tune.Callback):
    """Saves the ASHA scheduler's state (its rungs: the metric each trial had at each milestone) in
    Tune's experiment checkpoints and restores it on ``Tuner.restore`` (see the module docstring).

    PBT's state refers to Tune's ``Trial`` objects, which a restore re-creates, so a resumed PBT sweep
    starts its population statistics afresh (its trials continue from their checkpoints)."""

    def __init__(self, scheduler: TrialScheduler) -> None:
        self.scheduler = scheduler

    def get_state(self) -> dict[str, Any] | None:
        if isinstance(self.scheduler, AsyncHyperBandScheduler):
            return {"asha": dict(self.scheduler.__dict__)}
        return None

    def set_state(self, state: dict[str, Any]) -> None:
        if "asha" in state and isinstance(self.scheduler, AsyncHyperBandScheduler):
            self.scheduler.__dict__.update(state["asha"])
