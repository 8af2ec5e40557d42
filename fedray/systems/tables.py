"""Reading a user's per-client table (device speeds, availability traces) from CSV or Parquet."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedray.config import ConfigError


def read_columns(path: str, key: str, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    """``columns`` of the ``.csv`` or ``.parquet`` file at ``path`` as float64 arrays (``client_id``
    as int64); a missing file or column, or a non-numeric or non-finite value, is a config error naming ``key``."""
    import pandas as pd

    file = Path(path)
    if not file.is_file():
        raise ConfigError(key, f"{path} is not a file")
    try:
        table = pd.read_parquet(file) if file.suffix == ".parquet" else pd.read_csv(file)
    except Exception as error:  # pandas and pyarrow raise many kinds of errors for unreadable files
        raise ConfigError(
            key, f"cannot read {path} as {'Parquet' if file.suffix == '.parquet' else 'CSV'}: {str(error).splitlines()[0][:200]}"
        ) from None
    missing = [column for column in columns if column not in table.columns]
    if missing:
        raise ConfigError(key, f"{path} lacks the column(s) {', '.join(missing)} (it has {', '.join(map(str, table.columns[:10]))})")
    values: dict[str, np.ndarray] = {}
    for column in columns:
        try:
            array = table[column].to_numpy(dtype=np.float64)
        except (TypeError, ValueError):
            raise ConfigError(key, f"{path}: column {column} is not numeric") from None
        if not np.isfinite(array).all():
            raise ConfigError(
                key, f"{path}: column {column} has a missing or non-finite value in row {int(np.flatnonzero(~np.isfinite(array))[0]) + 1}"
            )
        values[column] = array
    ids = values["client_id"]
    if (ids != np.round(ids)).any():
        raise ConfigError(key, f"{path}: client_id must be whole numbers")
    values["client_id"] = ids.astype(np.int64)
    return values


def check_client_ids(ids: np.ndarray, num_clients: int, path: str, key: str) -> None:
    """Every id must name one of the run's ``num_clients`` clients (0 .. num_clients - 1)."""
    unknown = ids[(ids < 0) | (ids >= num_clients)]
    if len(unknown):
        raise ConfigError(
            key,
            f"{path}: unknown client id {int(unknown[0])} ({len(unknown)} row(s)); the run has client ids 0..{num_clients - 1} (data.num_clients={num_clients})",
        )
