"""Bad inputs to the ``fedray`` command: each exits with code 2 before the run starts, with one line
of error (after the ``invalid config:`` header where the message has one), no traceback, and nothing
written (no run directory). A value the schema refuses stops the command before torch or Ray is
imported; the checks that need the algorithm's code or the data run before Ray starts.

Keep this table growing: every bad input found in the wild gets a row. Each row runs the real CLI in
its own process in a fresh directory (``files`` are written there first): a fork of a process that
has imported torch, Ray and the algorithms once (tests/preloaded_cli.py), which also checks that the
command returned without starting Ray. The tests below the table run ``python -m fedray.cli.main``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from preloaded_cli import run_fedray_preloaded

REPO = Path(__file__).resolve().parents[2]
DEEP = 5000


def _alias_bomb() -> str:
    """A 600-byte YAML that expands to 9^9 values (a "billion laughs")."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        ref = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([ref] * 9)}]")
    return "\n".join(lines) + "\n"


def _tiny_imagenet_with_a_corrupt_jpeg(root: Path) -> None:
    from PIL import Image

    base = root / "tiny-imagenet-200"
    (base / "val" / "images").mkdir(parents=True)
    (base / "wnids.txt").write_text("n01\nn02\n")
    for wnid in ("n01", "n02"):
        (base / "train" / wnid / "images").mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (64, 64), (10 * i, 100, 200)).save(base / "train" / wnid / "images" / f"{wnid}_{i}.JPEG")
    (base / "train" / "n02" / "images" / "n02_1.JPEG").write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    Image.new("RGB", (64, 64)).save(base / "val" / "images" / "val_0.JPEG")
    (base / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn01\t0\t0\t63\t63\n")


def _tiny_imagenet_with_spaces_for_tabs(root: Path) -> None:
    _tiny_imagenet_with_a_corrupt_jpeg(root)
    (root / "tiny-imagenet-200" / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn01\t0\t0\t63\t63\nval_1.JPEG n02 0 0 63 63\n")


# (id, fedray arguments, files to create {name: text | bytes | callable(dir)}, text the error must contain)
CASES = [
    # --- config values (rejected in milliseconds, before torch is imported)
    ("negative-seed", ["run", "--set", "seed=-1"], {}, "seed: Input should be greater than or equal to 0"),
    ("huge-seed", ["run", "--set", "seed=99999999999"], {}, "seed: Input should be less than"),
    ("inf-alpha", ["run", "--set", "data.alpha=.inf"], {}, "data.alpha: Input should be a finite number"),
    ("nan-lr", ["run", "--set", "train.lr=nan"], {}, "train.lr: Input should be a finite number"),
    ("inf-lr-word", ["run", "--set", "train.lr=inf"], {}, "train.lr: Input should be a finite number"),
    (
        "nan-algorithm-key",
        ["run", "--set", "algorithm.name=fedprox", "--set", "algorithm.mu=.nan"],
        {},
        "algorithm.mu: Input should be a finite number",
    ),
    ("name-leaves-dir", ["run", "--set", "output.name=../escape"], {}, "output.name: must be a plain directory name"),
    ("name-absolute", ["run", "--set", "output.name=/tmp/elsewhere"], {}, "output.name: must be a plain directory name"),
    ("name-dotdot", ["run", "--set", "output.name=.."], {}, "output.name: must be a plain directory name"),
    ("unknown-key", ["run", "--set", "data.colour=red"], {}, "data.colour: unknown key (allowed: "),
    ("huge-value-is-cut", ["run", "--set", "data.alpha=" + "x" * 100_000], {}, "data.alpha: Input should be a valid number"),
    ("huge-key-is-cut", ["run", "--set", "k" * 100_000 + "=1"], {}, "unknown key"),
    ("deep-override", ["run", "--set", "data.alpha=" + "[" * DEEP + "]" * DEEP], {}, "nested deeper than"),
    ("override-without-value", ["run", "--set", "data.alpha"], {}, "expected KEY=VALUE"),
    (
        "clients-per-round",
        ["run", "--set", "data.num_clients=5", "--set", "train.clients_per_round=6"],
        {},
        "train.clients_per_round (6) must be <=",
    ),
    ("gpu-fraction", ["run", "--set", "resources.gpus_per_worker=1.5"], {}, "resources.gpus_per_worker"),
    (
        "quantity-sigma-overflows",
        ["run", "--set", "data.partition=quantity", "--set", "data.quantity_sigma=1e6"],
        {},
        "data.quantity_sigma: Input should be less than or equal to 10",
    ),
    ("model-width", ["run", "--set", "model.width=100000"], {}, "model.width: Input should be less than or equal to 1024"),
    # --- config files
    ("missing-file", ["run", "nowhere.yaml"], {}, "config file not found: nowhere.yaml"),
    (
        "duplicate-key",
        ["run", "c.yaml"],
        {"c.yaml": "seed: 1\ndata:\n  alpha: 0.1\nseed: 2\n"},
        "c.yaml: not valid YAML at line 4, column 1: duplicate key 'seed'",
    ),
    ("duplicate-nested-key", ["run", "c.yaml"], {"c.yaml": "data:\n  alpha: 0.1\n  alpha: 0.2\n"}, "duplicate key 'alpha'"),
    ("not-utf8", ["run", "c.yaml"], {"c.yaml": b"seed: 1\ndata: {root: \xff\xfe}\n"}, "c.yaml: not UTF-8 text"),
    ("alias-bomb", ["run", "c.yaml"], {"c.yaml": _alias_bomb()}, "c.yaml: more than 100,000 values (YAML aliases expanded)"),
    ("deep-nesting", ["run", "c.yaml"], {"c.yaml": "data: " + "[" * DEEP + "]" * DEEP + "\n"}, "c.yaml: nested deeper than 32 levels"),
    ("too-big", ["run", "c.yaml"], {"c.yaml": "# " + "x" * (1024 * 1024) + "\n"}, "a config may have at most 1,048,576"),
    ("top-level-list", ["run", "c.yaml"], {"c.yaml": "- seed\n"}, "the top level must be a mapping"),
    ("python-tag", ["run", "c.yaml"], {"c.yaml": "seed: !!python/object/apply:os.system ['true']\n"}, "could not determine a constructor"),
    ("broken-yaml", ["run", "c.yaml"], {"c.yaml": "data: [1,\n"}, "c.yaml: not valid YAML at line 2"),
    # --- command line
    ("malformed-address", ["run", "--address", "not an address"], {}, "--address 'not an address': expected auto, HOST:PORT"),
    ("address-bad-port", ["run", "--address", "127.0.0.1:99999"], {}, "--address '127.0.0.1:99999'"),
    ("resume-not-a-run", ["run", "--resume", "nowhere"], {}, "nowhere is not a fedray run directory"),
    ("resume-with-overrides", ["run", "--resume", "x", "--set", "seed=1"], {}, "--resume takes the run directory only"),
    ("submit-bad-config", ["submit", "--address", "http://127.0.0.1:1", "--", "run", "--set", "seed=-1"], {}, "seed: Input should be"),
    # --- checks that need the data (digits loads in a second; a local Ray is starting meanwhile)
    ("test-fraction-leaves-nothing", ["run", "--set", "data.test_fraction=0.999"], {}, "data: The train_size = 1"),
    (
        "model-too-big-for-data",
        ["run", "--set", "model.name=cnn_cifar"],
        {},
        "model.name: cnn_cifar needs image_size >= 16, got 8 (data.name=digits has 1×8×8 images)",
    ),
    (
        "more-classes-than-data",
        ["run", "--set", "data.partition=shards", "--set", "data.classes_per_client=20"],
        {},
        "data.classes_per_client: 20 is more than the 10 classes of digits",
    ),
    (
        "more-clients-than-samples",
        ["run", "--set", "data.num_clients=2000", "--set", "data.partition=iid"],
        {},
        "data.num_clients (K=2000) exceeds the number of training samples",
    ),
    (
        "output-dir-is-a-file",
        ["run", "--set", "output.dir=afile"],
        {"afile": "I am a file\n"},
        "output.dir: afile is a file, not a directory",
    ),
    (
        "run-dir-exists",
        ["run", "--set", "output.name=taken"],
        {"runs/taken/config.yaml": "seed: 0\n"},
        "the run directory runs/taken already exists",
    ),
    (
        "synthetic-beyond-memory",
        ["run", "--set", "data.name=synthetic", "--set", "data.synthetic.num_train=100000000000"],
        {},
        "data.synthetic: 100,000,000,000 + 2,000 images of 1×8×8 need about",
    ),
    ("workers-beyond-the-machine", ["run", "--set", "resources.num_workers=10000"], {}, "resources.num_workers: 10000 worker(s)"),
    (
        "corrupt-tiny-imagenet-jpeg",
        ["run", "--set", "data.name=tinyimagenet", "--set", "data.root=tiny"],
        {"tiny": _tiny_imagenet_with_a_corrupt_jpeg},
        "data.name=tinyimagenet: cannot read the image tiny/tiny-imagenet-200/train/n02/images/n02_1.JPEG",
    ),
    (
        "malformed-tiny-imagenet-annotation",
        ["run", "--set", "data.name=tinyimagenet", "--set", "data.root=tiny"],
        {"tiny": _tiny_imagenet_with_spaces_for_tabs},
        "data.name=tinyimagenet: tiny/tiny-imagenet-200/val/val_annotations.txt line 2: expected IMAGE<TAB>WNID",
    ),
    (
        "hopeless-dirichlet-equal-size",
        ["run", "--set", "data.partition=dirichlet_equal_size", "--set", "data.alpha=1e-6"],
        {},
        "data.alpha: data.partition=dirichlet_equal_size found no draw in 1000 that gave each of the 10 clients",
    ),
]


def _has_cuda() -> bool:
    import torch

    return torch.cuda.device_count() > 0


def run_fedray(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""}
    return subprocess.run([sys.executable, "-m", "fedray.cli.main", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def tree(directory: Path) -> set[str]:
    return {str(path.relative_to(directory)) for path in directory.rglob("*")}


def create_files(directory: Path, files: dict) -> None:
    for name, content in files.items():
        path = directory / name
        if callable(content):
            content(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)


def assert_rejected(result: subprocess.CompletedProcess, expected: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr[-3000:])
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    header = lines[:1] == ["fedray: invalid config:"]
    assert len(lines) == 1 + header, lines  # one line of error (after the header, if any)
    assert lines[0].startswith("fedray: ")
    without_paths = re.sub(r"/\S+", "/…", lines[-1])  # the paths it names are as long as the user's (pytest -n lengthens them)
    assert len(without_paths) < 500, f"an error line of {len(without_paths)} characters besides its paths"
    assert expected in result.stderr, result.stderr


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, set[str], set[str]]]:
    """Every case run once, each by a process of its own in a directory of its own: id -> (result,
    files before, files after)."""
    results = {}
    for case_id, args, files, _ in CASES:
        directory = tmp_path_factory.mktemp(case_id)
        create_files(directory, files)
        before = tree(directory)
        results[case_id] = (run_fedray_preloaded(args, directory), before, tree(directory))
    return results


@pytest.mark.parametrize(("case_id", "expected"), [(case[0], case[3]) for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(outcomes, case_id, expected):
    result, before, after = outcomes[case_id]
    assert_rejected(result, expected)
    assert after == before  # no run directory, no config.yaml, no temporary file


def test_gpu_workers_without_a_gpu_are_refused(tmp_path):
    if _has_cuda():
        pytest.skip("this machine has a GPU")
    result = run_fedray_preloaded(["run", "--set", "resources.gpus_per_worker=0.5"], tmp_path)
    assert_rejected(result, "resources.gpus_per_worker: 0.5 but this machine has no GPU")
    assert tree(tmp_path) == set()


def test_an_unreachable_cluster_fails_in_seconds_and_writes_nothing(tmp_path):
    """Exit 1 (the input is well-formed; nothing listens there), after a 5 s connection timeout at most,
    never Ray's minutes of retries, and before any run directory exists."""
    result = run_fedray(["run", "--address", "127.0.0.1:1"], tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        "fedray: cannot reach the Ray cluster at 127.0.0.1:1 (Connection refused within 5 s); is it running?"
    ]
    assert tree(tmp_path) == set()


def test_a_bad_config_value_fails_before_torch_is_imported(tmp_path):
    """The schema is checked before the algorithms' code (and torch) or Ray is imported: a typo costs
    well under a second, not torch's import."""
    probe = (
        "import sys\nfrom fedray.cli.main import main\ncode = main(['run', '--set', 'train.lr=nan'])\n"
        "print(code, 'torch' in sys.modules, 'ray' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.split() == ["2", "False", "False"], (result.stdout, result.stderr[-2000:])
    assert "train.lr: Input should be a finite number" in result.stderr
