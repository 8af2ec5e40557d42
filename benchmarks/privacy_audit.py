"""The empirical privacy audit (``privacy.audit``, docs/guide/privacy.md, 'Auditing a run
empirically'): DP-FedAvg on digits (examples/dp_audit_digits.yaml: 20 clients, 10 a round, mlp of width 128,
10 rounds, C = 0.5, δ = 1e-5, 2,000 canaries, 500 guesses a side) at two noise multipliers and
without noise, the accountant's ε next to the audit's lower bound (95% confidence, Steinke et al.
2023, Thm. 3.1).

One command writes the raw JSON (commit, torch, machine, date) to
``docs/results/raw/privacy_audit.json`` and prints the Markdown table:

    python benchmarks/privacy_audit.py
    python benchmarks/privacy_audit.py --table   # the table from the committed JSON
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from vectorized import machine  # noqa: E402

import fedray  # noqa: E402

DEFAULT_JSON = REPO / "docs" / "results" / "raw" / "privacy_audit.json"
CONFIG = REPO / "examples" / "dp_audit_digits.yaml"
NOISE_MULTIPLIERS = (2.0, 1.0, 0.0)


def audited(noise_multiplier: float, out_dir: str) -> dict:
    config = fedray.load_config(str(CONFIG), [f"privacy.noise_multiplier={noise_multiplier}", f"output.dir={out_dir}"])
    start = time.perf_counter()
    summary = fedray.run_experiment(config, progress=False)
    row = fedray.read_metrics(summary.run_dir)[-1]
    return {
        "noise_multiplier": noise_multiplier,
        "rounds": int(row["round"]),
        "accountant_epsilon": row["dp_epsilon"],
        "audit_epsilon_lower_bound": row["audit_epsilon_lower_bound"],
        "audit_correct_guesses": int(row["audit_correct_guesses"]),
        "audit_guesses": int(row["audit_guesses"]),
        "audit_canaries": int(row["audit_canaries"]),
        "final_test_accuracy": summary.final_test_accuracy,
        "seconds": round(time.perf_counter() - start, 1),
    }


def table(report: dict) -> str:
    lines = [
        "| noise multiplier z | accountant's ε (δ = 1e-5) | audit's ε lower bound (95%) | correct guesses | test accuracy |",
        "|---|---|---|---|---|",
    ]
    for row in report["results"]:
        epsilon = "∞" if math.isinf(row["accountant_epsilon"]) else f"{row['accountant_epsilon']:.2f}"
        lines.append(
            f"| {row['noise_multiplier']:g} | {epsilon} | {row['audit_epsilon_lower_bound']:.2f} | "
            f"{row['audit_correct_guesses']} / {row['audit_guesses']} | {row['final_test_accuracy']:.1%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--table", action="store_true", help="print the table of the committed JSON only")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(args.json.read_text())))
        return 0
    report = {**machine(), "config": str(CONFIG.relative_to(REPO)), "results": []}
    with tempfile.TemporaryDirectory() as out_dir:
        for z in NOISE_MULTIPLIERS:
            report["results"].append(audited(z, out_dir))
            print(json.dumps(report["results"][-1]), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")  # ∞ is written as Infinity, as summary.json does
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
