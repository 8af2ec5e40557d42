"""The ``privacy`` and ``robust`` config sections: differential privacy of client uploads and robust
aggregation (docs/guide/privacy.md). Both are off by default, and off a run computes exactly what it
did without them.

Symbols (DP-FedAvg, McMahan et al., ICLR 2018, Alg. 1) → keys: C (clipping bound S) →
``privacy.clip``, z (noise multiplier; the noise on the sum has std z·C) → ``privacy.noise_multiplier``,
(ε, δ) → ``privacy.target_epsilon`` / ``privacy.delta``, q (sampling probability) →
``train.clients_per_round / data.num_clients`` (or ``privacy.noise_cohort_size /
privacy.population_size``). Adaptive clipping (Andrew et al., NeurIPS 2021, "Differentially Private
Learning with Adaptive Clipping", Alg. 1): γ (target quantile) → ``privacy.target_quantile``, η_C
(clip learning rate) → ``privacy.clip_lr``, σ_b (noise on the count of unclipped updates) →
``privacy.clipped_count_stddev``, C⁰ → ``privacy.clip``. The bounds of the other upload kinds (docs/guide/privacy.md,
'Every upload kind'): prototypes and class representations → ``privacy.clip_prototypes``, logit knowledge →
``privacy.clip_logits``, per-class counts → ``privacy.clip_counts``, SCAFFOLD's control-variate updates Δc_i →
``privacy.clip_controls``. Krum's f (Blanchard et al., NeurIPS 2017) → ``robust.krum_f``, the
trimmed mean's β (Yin et al., ICML 2018) → ``robust.trim_fraction``, Bulyan's f (El Mhamdi et al., ICML 2018) →
``robust.krum_f``; ALIE's z (Baruch et al., NeurIPS 2019) → ``robust.alie_z``; the backdoor's trigger, share of
poisoned samples, target label and boost factor γ (Bagdasaryan et al., AISTATS 2020) → ``robust.trigger_size``,
``robust.poison_fraction``, ``robust.target_class``, ``robust.boost``.
"""

from __future__ import annotations

import math
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Section(BaseModel):
    """As :class:`fedray.config.schema.Section` (unknown keys are errors, floats finite unless a field
    allows ±inf); repeated here because that module imports this one."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, ser_json_inf_nan="constants")


class AuditConfig(_Section):
    """``privacy.audit``: an empirical lower bound on the run's ε from the run itself (Steinke, Nasr and
    Jagielski, NeurIPS 2023; :mod:`fedray.privacy.audit`). Off (0 canaries) by default."""

    canaries: int = Field(
        0,
        ge=0,
        description="m: random update directions of norm privacy.clip, each 'in' with probability ½; an 'in' canary joins "
        "each round's clipped sum, before the central noise, with the accountant's sampling probability (0: no audit)",
    )
    guesses: int | None = Field(
        None, gt=0, description="k: the k highest-scoring canaries are guessed 'in' and the k lowest 'out' (None: m/4)"
    )
    confidence: float = Field(0.95, gt=0, lt=1, description="the confidence of the reported lower bound on ε")

    @property
    def enabled(self) -> bool:
        return self.canaries > 0

    @property
    def per_side(self) -> int:
        """k: the guesses on each side."""
        return self.guesses if self.guesses is not None else max(1, self.canaries // 4)


class SecureAggregationConfig(_Section):
    """``privacy.secure_aggregation``: the server sees only the cohort's sum, as under SecAgg (Bonawitz et
    al., CCS 2017) or SecAgg+ (Bell et al., CCS 2020), simulated: no cryptography runs; what is modelled is
    the sum-only release, the dropout threshold t, distributed noise and the protocol's cost
    (:mod:`fedray.privacy.secure_aggregation`). Off by default."""

    enabled: bool = False
    protocol: Literal["secagg", "secagg_plus"] = Field(
        "secagg",
        description="secagg: each client agrees keys with every other client of the round (Bonawitz et al. 2017); "
        "secagg_plus: with its k neighbours on a random k-regular graph, k = O(log n) (Bell et al. 2020)",
    )
    threshold: float = Field(
        0.5,
        gt=0,
        description="t, the clients that must report for the sum to be unmasked: a fraction (<= 1) of "
        "train.clients_per_round, rounded up, or a count (an integer > 1); a round with fewer fails, unchanged",
    )
    degree: int | None = Field(
        None, gt=0, description="secagg_plus: k, each client's neighbours (None: min(n − 1, ⌈2·log₂ n⌉) for n clients)"
    )
    noise: Literal["central", "distributed"] = Field(
        "central",
        description="under privacy.mechanism=central: central, the server adds the noise to the sum; distributed, each of "
        "the m = train.clients_per_round clients adds N(0, σ²/m) to its masked upload, so that the sum carries σ²",
    )


class PrivacyConfig(_Section):
    """``privacy``: user-level differential privacy of every upload (weights, prototypes, ...)."""

    mechanism: Literal["none", "central", "local"] = Field(
        "none",
        description="none; central: clip each client's update, Gaussian noise on the server's sum (DP-FedAvg); "
        "local: clip and add Gaussian noise on each client before it uploads",
    )
    clip: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=True,
        description="L2 bound C of each client's update of each upload kind (.inf: no clipping); C⁰ under clipping: adaptive",
    )
    clip_prototypes: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=True,
        description="L2 bound of each client's per-class prototypes or class representations (FedProto, FedProc, FedSC, "
        "FedCoSR; the [classes, d] upload as one vector), needed when the algorithm uploads them (.inf: no clipping)",
    )
    clip_logits: float | None = Field(
        None, gt=0, allow_inf_nan=True, description="L2 bound of each client's per-class logit knowledge (FedSKC, [classes, classes])"
    )
    clip_controls: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=True,
        description="L2 bound of each client's control-variate update Δc_i = c_i⁺ − c_i (SCAFFOLD; the summed "
        "[parameters] upload), needed when the algorithm uploads them (.inf: no clipping)",
    )
    clip_counts: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=True,
        description="L2 bound of the per-class counts or weights sent with summed prototypes (FedProto, FedProc, FedCoSR); "
        "a client's prototype sums and counts are scaled by one factor, so its class means are kept and its weight capped",
    )
    noise_multiplier: float | None = Field(
        None,
        ge=0,
        description="z: the Gaussian noise has std z·C; with P released parts (weights, prototypes, counts...) each is noised "
        "with √P·z·C_part, one Gaussian mechanism of multiplier z together (None: calibrated from target_epsilon and train.rounds)",
    )
    target_epsilon: float | None = Field(
        None, gt=0, description="ε to reach after train.rounds (calibrates z) or, with noise_multiplier set, a budget the run stops at"
    )
    delta: float | None = Field(None, gt=0, lt=1, description="δ of the reported (ε, δ) (None: 1/population^1.1)")
    allow_large_delta: bool = Field(False, description="accept δ ≥ 1/population (warned about in the log)")
    accountant: Literal["rdp", "pld"] = Field("rdp", description="dp-accounting's Rényi DP or privacy-loss-distribution accountant")
    sampling: Literal["poisson", "fixed_size"] = Field(
        "poisson",
        description="the sampling the accountant assumes: poisson (add/remove neighbours, as McMahan et al. and pfl) or "
        "fixed_size (the cohort fedray draws; replace-one neighbours, so the sensitivity is 2C)",
    )
    population_size: int | None = Field(None, gt=0, description="the population the accountant assumes (None: data.num_clients)")
    noise_cohort_size: int | None = Field(
        None,
        gt=0,
        description="calibrate the noise as if this many clients were sampled per round (pfl's noise_cohort_size): the "
        "sum's noise std is z·C·clients_per_round/noise_cohort_size and q = noise_cohort_size/population",
    )
    clipping: Literal["fixed", "adaptive"] = Field(
        "fixed",
        description="fixed: every round clips to privacy.clip; adaptive (central DP only): the bound starts at privacy.clip "
        "and follows the target_quantile of the clients' update norms (Andrew et al., NeurIPS 2021)",
    )
    target_quantile: float = Field(
        0.5, gt=0, lt=1, description="adaptive clipping: γ, the share of updates the bound should leave unclipped"
    )
    clip_lr: float = Field(0.2, gt=0, description="adaptive clipping: η_C of the geometric update C ← C·exp(−η_C·(b̃ − γ))")
    clipped_count_stddev: float | None = Field(
        None,
        gt=0,
        description="adaptive clipping: σ_b, the std of the noise on the count of unclipped updates of a cohort of "
        "noise_cohort_size clients (None: noise_cohort_size/20, the paper's choice); must exceed z/2",
    )
    secure_aggregation: SecureAggregationConfig = Field(
        default_factory=SecureAggregationConfig,
        description="secure aggregation, simulated: the server sees only the sum of the cohort's uploads",
    )
    audit: AuditConfig = Field(
        default_factory=AuditConfig,
        description="an empirical privacy audit from canaries (central DP only; privacy.noise_multiplier 0 audits a run "
        "without noise, whose accountant's ε is infinite)",
    )

    @property
    def enabled(self) -> bool:
        return self.mechanism != "none"

    @model_validator(mode="after")
    def _noise_is_determined(self) -> "PrivacyConfig":
        if self.audit.enabled and self.mechanism != "central":
            raise ValueError(
                "privacy.audit needs privacy.mechanism=central (its canaries join the server's clipped sum before the central "
                "noise); for a run without noise, set privacy.mechanism=central and privacy.noise_multiplier=0"
            )
        if self.audit.enabled and self.sampling != "poisson":
            raise ValueError("privacy.audit needs privacy.sampling=poisson (its canaries are added or removed, each sampled with q)")
        if self.audit.enabled and 2 * self.audit.per_side > self.audit.canaries:
            raise ValueError(
                f"privacy.audit.guesses ({self.audit.per_side}) must be <= privacy.audit.canaries / 2 ({self.audit.canaries // 2}): "
                "k canaries are guessed 'in' and k others 'out'"
            )
        if self.mechanism == "none":
            return self
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError("privacy.mechanism needs privacy.noise_multiplier or privacy.target_epsilon")
        if self.mechanism == "local" and self.noise_multiplier is None:
            raise ValueError("privacy.mechanism=local needs privacy.noise_multiplier (each client's ε is reported, not targeted)")
        if self.accountant == "pld" and self.sampling == "fixed_size":
            raise ValueError("privacy.accountant=pld supports privacy.sampling=poisson only; use privacy.accountant=rdp for fixed_size")
        if self.noise_multiplier is not None and self.noise_multiplier > 0 and math.isinf(self.clip):
            raise ValueError("privacy.clip must be finite when privacy.noise_multiplier > 0 (the noise std is z·C)")
        if self.clipping == "adaptive" and self.mechanism != "central":
            raise ValueError("privacy.clipping=adaptive needs privacy.mechanism=central (the noised count of clipped updates is central)")
        if self.clipping == "adaptive" and math.isinf(self.clip):
            raise ValueError("privacy.clip must be finite with privacy.clipping=adaptive (it is the initial bound C⁰)")
        return self


class RobustConfig(_Section):
    """``robust``: a robust server rule for weighted-mean algorithms, and simulated attackers
    (:mod:`fedray.aggregation.attacks`, :mod:`fedray.aggregation.robust`)."""

    rule: Literal["none", "median", "trimmed_mean", "krum", "multi_krum", "bulyan"] = Field(
        "none", description="none (the algorithm's weighted mean) or a rule over the clients' individual updates"
    )
    trim_fraction: float = Field(0.1, ge=0, lt=0.5, description="trimmed_mean: β, the share cut at each end per coordinate")
    krum_f: int = Field(1, ge=0, description="krum/multi_krum/bulyan: f, the number of Byzantine clients tolerated")
    multi_krum_m: int | None = Field(None, gt=0, description="multi_krum: updates averaged (None: cohort − f)")
    attackers: Literal["fraction", "per_round"] = Field(
        "fraction",
        description="fraction: a seeded share malicious_fraction of the population attacks whenever sampled (a round's "
        "count varies); per_round: exactly attackers_per_round of each round's cohort, drawn from (seed, round)",
    )
    malicious_fraction: float = Field(0.0, ge=0, le=1, description="attackers=fraction: share of the population that attacks (seeded)")
    attackers_per_round: int | None = Field(None, ge=0, description="attackers=per_round: k, the attackers in every round's cohort")
    attack: Literal["sign_flip", "scaled", "random", "alie", "label_flip", "backdoor"] = Field(
        "sign_flip",
        description="what a malicious client does: uploads instead of its update Δ sign_flip −s·Δ, scaled s·Δ, random a "
        "Gaussian vector of norm s·‖Δ‖ (s = attack_scale), alie μ − z·σ of the benign updates (Baruch et al. 2019); or "
        "trains on poisoned data: label_flip y → C−1−y (Tolpegin et al. 2020), backdoor a trigger relabelled "
        "target_class (Bagdasaryan et al. 2020)",
    )
    attack_scale: float = Field(4.0, gt=0, description="s of sign_flip, scaled and random")
    alie_z: float | None = Field(None, description="alie: z (None: the paper's z^max for the round's n clients and m attackers)")
    trigger_size: int = Field(3, gt=0, description="backdoor: side of the white square stamped in the images' bottom-right corner")
    poison_fraction: float = Field(0.5, gt=0, le=1, description="backdoor: share of a malicious client's samples poisoned")
    target_class: int = Field(0, ge=0, description="backdoor: the label the triggered samples get")
    boost: float = Field(
        1.0, gt=0, description="label_flip/backdoor: b, the malicious update is b·Δ against the broadcast (model replacement)"
    )

    @property
    def attacking(self) -> bool:
        """Whether any client attacks (under either ``attackers`` mode)."""
        if self.attackers == "per_round":
            return bool(self.attackers_per_round)
        return self.malicious_fraction > 0

    @property
    def collects_updates(self) -> bool:
        """Whether the workers collect each client's update instead of summing them: a robust rule,
        or ALIE (computed from the benign updates on the server)."""
        return self.rule != "none" or (self.attack == "alie" and self.attacking)

    @property
    def enabled(self) -> bool:
        """A rule, attackers, or ``attack: backdoor`` (whose attack_success_rate a run without attackers
        reports too, its baseline): the section is then saved with the run's config."""
        return self.rule != "none" or self.attacking or self.attack == "backdoor"


class _Data(Protocol):
    num_clients: int
    task: str


class _Train(Protocol):
    clients_per_round: int
    mode: str


class _FedBuff(Protocol):
    buffer_size: int


class _Systems(Protocol):
    enabled: bool
    fedbuff: _FedBuff


class RunConfig(Protocol):
    """The run config as the functions below read it: the fields they use of
    :class:`fedray.config.schema.RunConfig`, which imports this module (so it is not imported here)."""

    data: _Data
    train: _Train
    systems: _Systems
    privacy: PrivacyConfig
    robust: RobustConfig


def population_size(config: RunConfig) -> int:
    """The population N the accountant assumes: ``privacy.population_size`` or ``data.num_clients``."""
    return config.privacy.population_size or config.data.num_clients


def noise_cohort_size(config: RunConfig) -> int:
    """The cohort the noise is calibrated for: ``privacy.noise_cohort_size`` or ``train.clients_per_round``;
    under ``train.mode: async`` the aggregation's K = ``systems.fedbuff.buffer_size`` (:func:`aggregated_cohort`)."""
    return config.privacy.noise_cohort_size or aggregated_cohort(config)


def aggregated_cohort(config: RunConfig) -> int:
    """m, the updates one aggregation is built for (DP-FedAvg's fixed denominator, the robust rules'
    n): ``train.clients_per_round``, or K = ``systems.fedbuff.buffer_size`` under ``train.mode: async``."""
    return config.systems.fedbuff.buffer_size if config.train.mode == "async" else config.train.clients_per_round


def aggregated_cohort_key(config: RunConfig) -> str:
    """The key that sets :func:`aggregated_cohort`, as refusals name it."""
    return "systems.fedbuff.buffer_size" if config.train.mode == "async" else "train.clients_per_round"


def async_privacy_problems(config: RunConfig) -> list[str]:
    """The ``privacy`` keys ``train.mode: async`` refuses, one line each (docs/guide/privacy.md,
    "Asynchronous aggregation"): each aggregation is accounted as one Gaussian mechanism at q = 1,
    since who arrives in a buffer depends on the clock and availability, not on a uniform sample, so
    the keys whose maths assumes a uniformly sampled cohort do not apply."""
    privacy = config.privacy
    if config.train.mode != "async" or not (privacy.enabled or privacy.secure_aggregation.enabled):
        return []
    why = "train.mode=async samples no cohort (who arrives depends on the clock and availability) and accounts each aggregation at q = 1"
    problems = []
    if privacy.population_size is not None:
        problems.append(
            f"privacy.population_size sets the sampling probability q = M/N of a uniformly sampled cohort; {why}: leave it unset"
        )
    if privacy.noise_cohort_size is not None:
        problems.append(
            f"privacy.noise_cohort_size calibrates the noise for a larger sampled cohort; {why}, with noise z·C on each buffer's sum: "
            "leave it unset"
        )
    if privacy.sampling == "fixed_size":
        problems.append(f"privacy.sampling=fixed_size accounts a cohort drawn without replacement; {why}: use privacy.sampling=poisson")
    if privacy.clipping == "adaptive":
        problems.append(
            "privacy.clipping=adaptive moves C after each round from a noised count over the sampled cohort, which train.mode=async "
            "does not simulate; use privacy.clipping=fixed"
        )
    if privacy.audit.enabled:
        problems.append(
            f"privacy.audit adds its canaries with the accountant's sampling probability of a sampled cohort; {why}: use train.mode=sync"
        )
    return problems


def clipped_count_stddev(config: RunConfig) -> float:
    """σ_b of adaptive clipping: ``privacy.clipped_count_stddev`` or noise_cohort_size/20 (the choice of Andrew et al. 2021 in their experiments)."""
    return config.privacy.clipped_count_stddev or noise_cohort_size(config) / 20


def adaptive_noise_problem(noise_multiplier: float, count_stddev: float) -> str | None:
    """Why z and σ_b cannot go together under adaptive clipping, or None: the update's own noise
    multiplier z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) (Andrew et al. 2021, Thm. 1) exists only for z < 2σ_b."""
    if noise_multiplier < 2 * count_stddev:
        return None
    return (
        f"privacy.clipped_count_stddev: σ_b = {count_stddev:g} must be > z/2 = {noise_multiplier / 2:g} under privacy.clipping=adaptive "
        "(the count's noise spends part of the privacy budget: z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2)); raise it, or privacy.noise_cohort_size"
    )


def default_delta(population: int) -> float:
    """δ = 1/N^1.1 when ``privacy.delta`` is not given: below 1/N, as (ε, δ)-DP needs to mean anything."""
    return population**-1.1


def privacy_and_robust_problems(config: RunConfig) -> list[str]:
    """Every problem (one line each) of the ``privacy`` and ``robust`` sections with each other and with
    the population and cohort sizes."""
    privacy, robust, cohort = config.privacy, config.robust, config.train.clients_per_round
    problems = async_privacy_problems(config)
    if privacy.enabled:
        population = population_size(config)
        if privacy.population_size is not None and privacy.population_size < config.data.num_clients:
            problems.append(f"privacy.population_size ({population}) must be >= data.num_clients ({config.data.num_clients})")
        if privacy.noise_cohort_size is not None and privacy.noise_cohort_size < cohort:
            problems.append(
                f"privacy.noise_cohort_size ({privacy.noise_cohort_size}) must be >= train.clients_per_round ({cohort}): "
                "it calibrates the noise for a larger cohort than the one simulated"
            )
        if noise_cohort_size(config) > population:
            problems.append(f"privacy.noise_cohort_size ({noise_cohort_size(config)}) must be <= the population ({population})")
        if privacy.delta is not None and privacy.delta >= 1 / population and not privacy.allow_large_delta:
            problems.append(
                f"privacy.delta ({privacy.delta:g}) is >= 1/population (1/{population}): such a δ allows releasing a client's "
                "data outright; lower it or set privacy.allow_large_delta=true"
            )
        if privacy.clipping == "adaptive" and privacy.noise_multiplier is not None and config.train.mode != "async":  # async: refused above
            problem = adaptive_noise_problem(privacy.noise_multiplier, clipped_count_stddev(config))
            if problem is not None:
                problems.append(problem)
        if privacy.mechanism == "central" and robust.rule != "none":
            problems.append(
                f"robust.rule={robust.rule} needs each client's update, and privacy.mechanism=central noises only their sum; "
                "use privacy.mechanism=local with a robust rule"
            )
    problems += robust_attack_problems(config) + secure_aggregation_problems(config)
    # a rule sees one aggregation's updates: the round's cohort, or under train.mode=async the buffer's K
    n, key = aggregated_cohort(config), aggregated_cohort_key(config)
    if robust.rule in ("krum", "multi_krum") and n < 2 * robust.krum_f + 3:
        problems.append(
            f"robust.rule={robust.rule} with robust.krum_f={robust.krum_f} needs {key} >= 2f + 3 = {2 * robust.krum_f + 3} (got {n})"
        )
    if robust.rule == "bulyan" and n < 4 * robust.krum_f + 3:
        problems.append(
            f"robust.rule=bulyan with robust.krum_f={robust.krum_f} needs {key} >= 4f + 3 = {4 * robust.krum_f + 3} (got {n}; El Mhamdi et al. 2018)"
        )
    if robust.rule == "trimmed_mean" and robust.trim_fraction > 0 and math.floor(robust.trim_fraction * n) == 0:
        problems.append(
            f"robust.rule=trimmed_mean cuts ⌊β·m⌋ = ⌊{robust.trim_fraction:g}·{n}⌋ = 0 updates at each end (robust.trim_fraction, "
            f"{key}), so it would be the plain mean of the updates; raise robust.trim_fraction to at least "
            f"1/m = {1 / n:.3g} (below 0.5) or {key}"
        )
    if robust.rule == "multi_krum" and robust.multi_krum_m is not None and robust.multi_krum_m > n - robust.krum_f:
        problems.append(f"robust.multi_krum_m ({robust.multi_krum_m}) must be <= {key} − robust.krum_f ({n - robust.krum_f})")
    return problems


def secure_aggregation_problems(config: RunConfig) -> list[str]:
    """Every problem (one line each) of ``privacy.secure_aggregation`` with the rest of the config; those
    of the algorithm's uploads are :func:`fedray.algorithms.uploads.upload_problems`'."""
    secagg, privacy, cohort = config.privacy.secure_aggregation, config.privacy, config.train.clients_per_round
    if not secagg.enabled:
        return []
    problems = []
    if secagg.threshold > 1 and not secagg.threshold.is_integer():
        problems.append(
            f"privacy.secure_aggregation.threshold ({secagg.threshold:g}) is a fraction (<= 1) of train.clients_per_round or a count "
            "(an integer)"
        )
    elif secagg.threshold > cohort:
        problems.append(
            f"privacy.secure_aggregation.threshold ({secagg.threshold:g}) must be <= train.clients_per_round ({cohort}): "
            "no round could reach it"
        )
    if config.robust.collects_updates:
        problems.append(
            "robust.rule (and robust.attack=alie) need each client's update, and privacy.secure_aggregation reveals only the "
            "cohort's sum; use one of them"
        )
    if secagg.noise == "distributed" and privacy.mechanism != "central":
        problems.append(
            "privacy.secure_aggregation.noise=distributed splits the central noise among the clients: it needs "
            f"privacy.mechanism=central (got {privacy.mechanism})"
        )
    if secagg.noise == "distributed" and privacy.mechanism == "central" and privacy.noise_multiplier is None:
        problems.append(
            "privacy.secure_aggregation.noise=distributed needs privacy.noise_multiplier (each client draws its share from it; "
            "privacy.target_epsilon then is a budget the run stops at)"
        )
    if secagg.noise == "distributed" and privacy.clipping == "adaptive":
        problems.append(
            "privacy.secure_aggregation.noise=distributed with privacy.clipping=adaptive is not simulated (the clients' shares "
            "would need the server's z_Δ); use privacy.clipping=fixed or noise=central"
        )
    if secagg.noise == "distributed" and privacy.audit.enabled:
        problems.append("privacy.audit scores the server's central noise; use privacy.secure_aggregation.noise=central with it")
    if secagg.degree is not None and secagg.protocol != "secagg_plus":
        problems.append("privacy.secure_aggregation.degree is SecAgg+'s k; set privacy.secure_aggregation.protocol=secagg_plus")
    if config.train.mode == "async":
        problems.append(
            "privacy.secure_aggregation masks a synchronous cohort's sum; train.mode=async's buffer fills with updates from clients "
            "of different model versions, which would need the buffer kept in a trusted execution environment (Nguyen et al., "
            "AISTATS 2022), not simulated here: use train.mode=sync"
        )
    return problems


def robust_attack_problems(config: RunConfig) -> list[str]:
    """Every problem (one line each) of the attackers' settings (``robust.attackers``,
    ``robust.attack`` and their keys) with the rest of the config; those that need the data (a
    backdoor on images) are :func:`fedray.aggregation.attacks.poisoning_problem`'s."""
    robust, cohort = config.robust, config.train.clients_per_round
    problems = []
    if robust.attackers == "per_round":
        if robust.attackers_per_round is None:
            problems.append("robust.attackers=per_round needs robust.attackers_per_round (the attackers in every round's cohort)")
        elif robust.attackers_per_round > cohort:
            problems.append(f"robust.attackers_per_round ({robust.attackers_per_round}) must be <= train.clients_per_round ({cohort})")
        if robust.malicious_fraction > 0:
            problems.append("robust.malicious_fraction is for robust.attackers=fraction; per_round uses robust.attackers_per_round")
        if config.systems.enabled and robust.attackers_per_round:
            problems.append(
                "robust.attackers=per_round draws its attackers from the round's seeded cohort, which systems.* replaces by "
                "the clients that report; use robust.attackers=fraction with systems.enabled"
            )
    elif robust.attackers_per_round is not None:
        problems.append("robust.attackers_per_round is for robust.attackers=per_round; fraction uses robust.malicious_fraction")
    if robust.attack in ("label_flip", "backdoor") and config.data.task != "classification":
        problems.append(f"robust.attack={robust.attack} poisons class labels: it needs data.task=classification (got {config.data.task})")
    if robust.boost != 1 and robust.attack not in ("label_flip", "backdoor"):
        problems.append(
            f"robust.boost scales the update of a data-poisoning attack (label_flip, backdoor); robust.attack={robust.attack} "
            "has robust.attack_scale (or none)"
        )
    if robust.attack == "alie" and robust.attacking and config.privacy.enabled:
        problems.append(
            "robust.attack=alie is computed on the server from the benign updates as received; it is not simulated under "
            "privacy.mechanism (the attackers' uploads would bypass the clients' clipping and noise)"
        )
    return problems
