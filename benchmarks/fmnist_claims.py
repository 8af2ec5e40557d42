"""Each paper's claim checked against the Fashion-MNIST table: ``docs/results/fmnist.md``'s claims table,
rendered from the table's committed CSVs (``fmnist.csv``, ``fmnist_curves.csv``), training nothing.

A :class:`Claim` names a paper's method, the baselines its claim says it beats and the direction (above,
or for a spread across clients, below). Every row of the table is one (method, baseline, setting): the
method's value minus the baseline's of the same seed (the same seed gives both the same data, cohorts,
data order and initial weights), its mean over the seeds both trained to the end and its 95 % Student's t
interval (``benchmark_tables.paired_text``), and a reading derived from those numbers alone:

* **holds**: the interval excludes 0 on the claimed side;
* **contradicted**: the interval excludes 0 on the other side;
* **not resolved**: the interval includes 0; the reading says on how many seeds the method was on the
  claimed side.

The value is the one the summary tables rank by (``real_table.GROUPS``' ``summary``: the mean of the last
fifth of the rounds, or the probe at the last round for the self-supervised group); a spread claim reads
the spread across clients at the final round. ``benchmarks/results_tables.py`` registers the table, so::

    python benchmarks/results_tables.py fmnist.md           # rewrite it from the CSVs
    python benchmarks/results_tables.py --check fmnist.md   # compare only
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

import real_table
from benchmark_tables import paired_text
from fmnist_tables import TABLE, TABLE_CURVES, Part, markdown_table

#: The spread across clients at the final round (a fraction, as the accuracies are).
SPREAD = "personal_accuracy_std_final"


@dataclass(frozen=True)
class Claim:
    """``paper`` claims ``methods`` are above (``lower_is_better``: below) each of ``baselines`` in ``group``
    of the table, on ``key`` (None: the group's summary value)."""

    paper: str
    claim: str
    group: str
    methods: tuple[str, ...]
    baselines: tuple[str, ...]
    key: str | None = None
    lower_is_better: bool = False


CLAIMS = (
    Claim("FedSC (KDD 2025)", "above FedProto and FedAvg under label skew", "global", ("fedsc",), ("fedproto", "fedavg")),
    Claim(
        "FedSKC (ICWS 2025)",
        "above FedSC, FedProto and FedAvg",
        "global",
        ("fedskc", "fedskc_stabilised"),
        ("fedsc", "fedproto", "fedavg"),
    ),
    Claim("FedRCL (CVPR 2024)", "above FedAvg", "global", ("fedrcl",), ("fedavg",)),
    Claim("FedRCL (CVPR 2024)", "its divergence penalty helps: above its β = 0 ablation", "global", ("fedrcl",), ("fedrcl_beta0",)),
    Claim("FedCoSR", "above FedPer and Local on each client's own split", "personalised", ("fedcosr",), ("fedper", "local")),
    Claim(
        "FedCoSR",
        "a lower spread of accuracy across clients than FedPer and Local",
        "personalised",
        ("fedcosr",),
        ("fedper", "local"),
        key=SPREAD,
        lower_is_better=True,
    ),
    Claim(
        "Hetero-SSFL",
        "above local SSL, FedAvg+BYOL, FedEMA and FedU on the linear probe (its Tables 1 and 4)",
        "ssl",
        ("hetero_ssfl",),
        ("hetero_ssfl_local", "fedavg_byol", "fedema", "fedu"),
    ),
)


def seed_values(rows: list[dict[str, str]], key: str) -> dict[str, float]:
    """``key`` of each seed that trained to the end."""
    return {r["seed"]: float(r[key]) for r in rows if not r.get("diverged") and r.get(key, "") != ""}


def reading(method: dict[str, float], baseline: dict[str, float], lower_is_better: bool) -> str:
    """What the paired differences say of the claim (the module's docstring gives the rule)."""
    seeds = sorted(set(method) & set(baseline))
    if not seeds:
        return "no seed in common"
    sign = -1 if lower_is_better else 1
    claimed_side = sum(sign * (method[s] - baseline[s]) > 0 for s in seeds)
    cell = paired_text(method, baseline, decimals=2, with_n=False) or ""
    if cell.startswith("**"):  # the interval excludes 0
        mean = float(np.mean([method[s] - baseline[s] for s in seeds]))
        return "**holds**" if sign * mean > 0 else "**contradicted**"
    side = "below" if lower_is_better else "above"
    return f"not resolved; {side} on {claimed_side} of {len(seeds)} seed{'s' * (len(seeds) > 1)}"


def claims_table(results: Path) -> str:
    """The claims table from the CSVs in ``results`` (:data:`CLAIMS`, one row per method, baseline and setting)."""
    tuning = real_table.read_csv(real_table.TUNING_CSV)
    entries, _ = real_table.table_entries(results / TABLE, [], tuning)
    cells = real_table.rows_by_cell(entries)
    rows = []
    for claim in CLAIMS:
        spec = real_table.GROUPS[claim.group]
        key = claim.key or spec["summary"][1]
        first = True
        for method in claim.methods:
            for baseline in claim.baselines:
                for setting in spec["settings"]:
                    mine = seed_values(cells.get((claim.group, method, setting), []), key)
                    theirs = seed_values(cells.get((claim.group, baseline, setting), []), key)
                    rows.append(
                        [
                            claim.paper if first else "",
                            claim.claim if first else "",
                            f"{real_table.LABELS[method]} − {real_table.LABELS[baseline]}",
                            real_table.SETTING_LABELS[setting],
                            paired_text(mine, theirs, decimals=2, with_n=True) or "–",
                            reading(mine, theirs, claim.lower_is_better),
                        ]
                    )
                    first = False
    header = ["paper", "claim", "difference", "setting", "mean [95 % CI], points", "reading"]
    return markdown_table(header, rows)


PART = Part("claims table", (TABLE, TABLE_CURVES), claims_table)
