"""Each client's device: training throughput and download/upload bandwidth, as arrays indexed by
client id (``systems.devices``).

Three sources: log-normal distributions (``source: distribution``; a client's values are drawn from
(seed, client id)), named device profiles (``source: profiles``: a client's profile is drawn from
(seed, client id) with the configured shares), or the user's table (``source: file``: one row per
client id with ``client_id, flops_per_second, download_mbps, upload_mbps``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedray.config import ConfigError
from fedray.config.schema import DevicesConfig, LogNormalConfig
from fedray.systems.draws import DEVICE_STREAM, standard_normal, uniform
from fedray.systems.tables import check_client_ids, read_columns

BYTES_PER_MEGABIT = 1e6 / 8


@dataclass(frozen=True)
class DeviceProfile:
    """A kind of device: its sustained training throughput and its link."""

    flops_per_second: float
    download_mbps: float
    upload_mbps: float


#: Orders of magnitude for sustained on-device training (not peak FLOP/s) and typical links; they are
#: illustrative, not measurements: for a study, give your own table (``source: file``).
DEVICE_PROFILES: dict[str, DeviceProfile] = {
    "phone_low": DeviceProfile(flops_per_second=2e9, download_mbps=5.0, upload_mbps=1.0),
    "phone_mid": DeviceProfile(flops_per_second=1e10, download_mbps=20.0, upload_mbps=5.0),
    "phone_high": DeviceProfile(flops_per_second=5e10, download_mbps=50.0, upload_mbps=20.0),
    "laptop": DeviceProfile(flops_per_second=1e11, download_mbps=100.0, upload_mbps=20.0),
    "edge_server": DeviceProfile(flops_per_second=1e12, download_mbps=1000.0, upload_mbps=1000.0),
}


@dataclass(frozen=True)
class Devices:
    """float64 ``[num_clients]`` arrays."""

    flops_per_second: np.ndarray
    download_bytes_per_second: np.ndarray
    upload_bytes_per_second: np.ndarray


def build_devices(config: DevicesConfig, seed: int, num_clients: int) -> Devices:
    """The run's devices from ``systems.devices``; a bad profile name or table is a config error."""
    if config.source == "distribution":
        ids = np.arange(num_clients)
        flops, down, up = (
            _log_normal(dist, seed, ids, draw)
            for draw, dist in enumerate((config.flops_per_second, config.download_mbps, config.upload_mbps))
        )
    elif config.source == "profiles":
        flops, down, up = _from_profiles(config.profiles, seed, num_clients)
    else:
        assert config.file is not None
        flops, down, up = _from_file(config.file, num_clients)
    return Devices(flops, down * BYTES_PER_MEGABIT, up * BYTES_PER_MEGABIT)


def _log_normal(distribution: LogNormalConfig, seed: int, client_ids: np.ndarray, draw: int) -> np.ndarray:
    return distribution.median * np.exp(distribution.sigma * standard_normal(seed, DEVICE_STREAM, 0, client_ids, draw))


def _from_profiles(shares: dict[str, float], seed: int, num_clients: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    unknown = [name for name in shares if name not in DEVICE_PROFILES]
    if unknown:
        raise ConfigError("systems.devices.profiles", f"unknown device profile {unknown[0]!r}; choose from {', '.join(DEVICE_PROFILES)}")
    profiles = [DEVICE_PROFILES[name] for name in shares]
    bounds = np.cumsum(list(shares.values())) / sum(shares.values())
    # a draw apart from the three of source=distribution
    which = np.minimum(
        np.searchsorted(bounds, uniform(seed, DEVICE_STREAM, 0, np.arange(num_clients), draw=6), side="right"), len(profiles) - 1
    )
    table = np.array([[p.flops_per_second, p.download_mbps, p.upload_mbps] for p in profiles])[which]
    return table[:, 0].copy(), table[:, 1].copy(), table[:, 2].copy()


def _from_file(path: str, num_clients: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    key = "systems.devices.file"
    columns = read_columns(path, key, ("client_id", "flops_per_second", "download_mbps", "upload_mbps"))
    ids = columns["client_id"]
    check_client_ids(ids, num_clients, path, key)
    if len(np.unique(ids)) != len(ids):
        raise ConfigError(key, f"{path}: client id {int(ids[np.flatnonzero(np.bincount(ids) > 1)[0]])} has more than one row")
    if len(ids) != num_clients:
        missing = np.setdiff1d(np.arange(num_clients), ids)
        raise ConfigError(
            key,
            f"{path}: no row for client id {int(missing[0])} ({len(missing)} of {num_clients} clients missing); give one row per client",
        )
    values = []
    for column in ("flops_per_second", "download_mbps", "upload_mbps"):
        if (columns[column] <= 0).any():
            raise ConfigError(key, f"{path}: column {column} must be > 0")
        by_client = np.empty(num_clients)
        by_client[ids] = columns[column]
        values.append(by_client)
    return values[0], values[1], values[2]
