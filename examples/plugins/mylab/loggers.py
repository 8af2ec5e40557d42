"""A user's own run callback (``output.callbacks: [mylab.loggers:JsonLinesLogger]``)."""

from __future__ import annotations

import json

from fedray import Callback


class JsonLinesLogger(Callback):
    """Appends every round's row to ``rounds.jsonl`` in the run directory."""

    def on_round_end(self, run, row, client_rows) -> None:
        with open(run.run_dir / "rounds.jsonl", "a") as file:
            file.write(json.dumps({key: value for key, value in row.items() if value == value}) + "\n")  # NaN dropped
