"""Loading 60,000 + 10,000 Fashion-MNIST images from a Parquet table of PNG bytes (``data.name: table``,
``data.image_column``) against fedray's IDX reader (``data.name: fmnist``), side by side in one process.

The Parquet files are written first (PNG-encoding 70,000 images, not timed) from the IDX files that
Debian's ``dataset-fashion-mnist`` package installs in /usr/share/datasets/fashion-mnist. Timed, each
``--repeats`` times (median reported), after one untimed IDX load that pays the imports:

- ``idx``: ``load_dataset`` of ``fmnist`` (gunzip + parse the IDX files);
- ``parquet, first``: ``load_dataset`` of the table with an empty cache directory (read the table,
  decode 70,000 PNGs with Pillow, write the ``.npz`` cache);
- ``parquet, cached``: the same config again (stat the files, read the cache);
- ``parquet arrays``: a table whose image column holds each image's pixel values (a flat list of
  784 uint8s and ``data.image_size: 28``): nothing to decode, nothing cached;
- ``parquet raw bytes``: the same pixels as a fixed-size binary column (784 bytes a row), which
  Parquet reads without decoding each value.

It also checks that the decoded arrays equal the IDX arrays bit for bit (PNG is lossless).

    python benchmarks/data_loading.py              # 3 repeats
    python benchmarks/data_loading.py --repeats 1
"""

from __future__ import annotations

import argparse
import functools
import io
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from fedray.config import DataConfig
from fedray.data import load_dataset


def write_png_table(x: np.ndarray, y: np.ndarray, path: Path) -> None:
    """uint8 ``[N, 1, H, W]`` images as a Parquet table of PNG bytes and labels."""
    encoded = []
    for image in x[:, 0]:
        buffer = io.BytesIO()
        Image.fromarray(image, mode="L").save(buffer, format="PNG")
        encoded.append(buffer.getvalue())
    pq.write_table(pa.table({"image": encoded, "label": y}), path)


def write_pixel_table(x: np.ndarray, y: np.ndarray, path: Path, raw_bytes: bool = False) -> None:
    """uint8 ``[N, 1, H, W]`` images as a Parquet table of flat pixel lists (or, ``raw_bytes``, of
    fixed-size binary rows) and labels."""
    if raw_bytes:
        pixels = pa.FixedSizeBinaryArray.from_buffers(pa.binary(x[0].size), len(x), [None, pa.py_buffer(np.ascontiguousarray(x).tobytes())])
    else:
        pixels = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x[0].size)
    pq.write_table(pa.table({"image": pixels, "label": y}), path)


def timed(function) -> tuple[float, object]:  # noqa: ANN001
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        idx_cfg = DataConfig(name="fmnist", root=str(scratch / "empty"))
        train, test, _ = load_dataset(idx_cfg, seed=0)  # untimed: imports and the page cache

        def table_config(stem: str, write: Callable[[np.ndarray, np.ndarray, Path], None], **keys: int) -> DataConfig:
            """Both splits written as ``<split><stem>.parquet`` by ``write``, and the config that loads them."""
            write(train.x, train.y, scratch / f"train{stem}.parquet")
            write(test.x, test.y, scratch / f"test{stem}.parquet")
            return DataConfig(
                name="table",
                path=str(scratch / f"train{stem}.parquet"),
                test_path=str(scratch / f"test{stem}.parquet"),
                image_column="image",
                root=str(scratch / "data"),
                **keys,
            )

        table_cfg = table_config("", write_png_table)
        sizes = sum((scratch / f"{split}.parquet").stat().st_size for split in ("train", "test"))
        pixels_cfg = table_config("_pixels", write_pixel_table, image_size=28)
        bytes_cfg = table_config("_bytes", functools.partial(write_pixel_table, raw_bytes=True), image_size=28)
        times: dict[str, list[float]] = {
            "idx": [],
            "parquet, first": [],
            "parquet, cached": [],
            "parquet arrays": [],
            "parquet raw bytes": [],
        }
        for _ in range(args.repeats):
            seconds, _ = timed(lambda: load_dataset(idx_cfg, seed=0))
            times["idx"].append(seconds)
            shutil.rmtree(scratch / "data", ignore_errors=True)
            seconds, (first_train, first_test, _) = timed(lambda: load_dataset(table_cfg, seed=0))
            times["parquet, first"].append(seconds)
            seconds, (cached_train, _, _) = timed(lambda: load_dataset(table_cfg, seed=0))
            times["parquet, cached"].append(seconds)
            seconds, (pixel_train, _, _) = timed(lambda: load_dataset(pixels_cfg, seed=0))
            times["parquet arrays"].append(seconds)
            seconds, (bytes_train, _, _) = timed(lambda: load_dataset(bytes_cfg, seed=0))
            times["parquet raw bytes"].append(seconds)
        assert np.array_equal(first_train.x, train.x) and np.array_equal(first_test.x, test.x)
        assert np.array_equal(cached_train.x, train.x) and np.array_equal(first_train.y, train.y)
        assert np.array_equal(pixel_train.x, train.x) and np.array_equal(bytes_train.x, train.x)
        cache = next((scratch / "data" / "cache").glob("*.npz"))
        print(f"Parquet files: {sizes / 1e6:.1f} MB of PNG bytes; cache file: {cache.stat().st_size / 1e6:.1f} MB")
        idx = statistics.median(times["idx"])
        print(f"{'loader':<18}{'median s':>10}{'× idx':>8}   (all runs)")
        for name, runs in times.items():
            median = statistics.median(runs)
            print(f"{name:<18}{median:>10.2f}{median / idx:>8.1f}   ({', '.join(f'{t:.2f}' for t in runs)})")


if __name__ == "__main__":
    main()
