"""Writes ``tests/durations.json`` from a JUnit XML of a full suite run: the seconds each scheduling
unit of ``pytest -n`` took (a test file, or an ``xdist_group`` across files; tests/conftest.py), for
units of 5 s or more. The scheduler hands the longest units out first, so that no long unit starts
last while the other worker has nothing left to do.

    python -m pytest -q -n 2 --junitxml=/tmp/suite.xml && python scripts/test_durations.py /tmp/suite.xml
"""

from __future__ import annotations

import argparse
import collections
import json
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "durations.json"
SHORTEST = 5.0  # seconds: shorter units keep their collection order, after the listed ones


def test_file(classname: str) -> str:
    """The test file of a JUnit ``classname`` (``tests.e2e.test_x`` or ``tests.e2e.test_x.TestClass``)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (REPO / path).is_file():
            return path
    raise SystemExit(f"no test file for {classname!r} under {REPO}")


def unit_seconds(junit: Path) -> dict[str, float]:
    """Seconds per scheduling unit: an ``xdist_group``'s name (the ``@group`` suffix of a test's name), else its file."""
    seconds: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).iter("testcase"):
        name = case.get("name", "")
        unit = name.rsplit("@", 1)[1] if "@" in name else test_file(case.get("classname", ""))
        seconds[unit] += float(case.get("time", 0))
    return {unit: round(value, 1) for unit, value in seconds.most_common() if value >= SHORTEST}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, help="the JUnit XML of a full `python -m pytest -q -n 2` run")
    args = parser.parse_args()
    units = unit_seconds(args.junit)
    OUT.write_text(json.dumps(units, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(REPO)}: {len(units)} units, {sum(units.values()):.0f} s")


if __name__ == "__main__":
    main()
