"""The support matrix (fedray.runtime.support): docs/support_matrix.md is what the code computes
now, so a change to a check, a declaration or an algorithm that changes a cell fails here until the
page is regenerated (``python -m fedray.runtime.support --markdown > docs/support_matrix.md``);
the cells follow the checks they come from; the text tables of ``fedray algorithms --matrix``. Whether
each cell does what it says when run: test_support_walk.py."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from fedray.algorithms import ALGORITHMS
from fedray.runtime.support import (
    DEVIATES,
    FEATURES,
    LEGEND,
    REFUSED,
    SUPPORTED,
    cells_text,
    matrix_markdown,
    matrix_text,
    support_matrix,
)
from preloaded_cli import run_fedray_preloaded

pytestmark = pytest.mark.xdist_group("support_matrix")  # with pytest -n: one worker computes the matrix once for both files

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "support_matrix.md"


@functools.cache
def full_matrix():
    """Every algorithm's cells with every feature, computed once for the session (test_support_walk.py
    reads its cells too)."""
    return support_matrix()


@pytest.fixture(scope="module")
def matrix():
    return full_matrix()


def test_the_page_is_what_the_code_computes(matrix):
    assert PAGE.read_text() == matrix_markdown(matrix), (
        "docs/support_matrix.md and the code disagree: regenerate it with "
        "`python -m fedray.runtime.support --markdown > docs/support_matrix.md` and review the diff"
    )


def test_every_algorithm_has_every_feature_and_its_base_config_is_accepted(matrix):
    """Each built-in's base config (its defaults, with what its requirements ask for) passes the
    checks: a refusal in the matrix is the feature's, never the base config's."""
    assert matrix.algorithms == list(ALGORITHMS)
    for name in matrix.algorithms:
        assert matrix.cell(name, "systems").status == SUPPORTED, (name, matrix.cell(name, "systems").notes)
        assert matrix.cell(name, "classification").status == SUPPORTED
        for feature in FEATURES:
            cell = matrix.cell(name, feature.key)
            assert cell.status in (SUPPORTED, DEVIATES, REFUSED)
            assert cell.notes or cell.status == SUPPORTED  # a refusal has its reason, a deviation says what


def test_cells_come_from_the_checks_and_the_declarations(matrix):
    # compressed since FedSKC declares its per-client weights and its logit knowledge (Upload.compressed)
    assert matrix.cell("fedskc", "topk").status == SUPPORTED and not matrix.cell("fedskc", "topk").notes
    assert matrix.cell("fedavg", "topk").status == SUPPORTED and not matrix.cell("fedavg", "topk").notes
    assert matrix.cell("ditto", "topk").status == SUPPORTED  # a personalised split uploads its shared part's weights
    feddyn = matrix.cell("feddyn", "topk")
    assert feddyn.status == REFUSED and feddyn.notes[0].startswith(
        "systems.compression.method: compression encodes the uploads an algorithm declares, but feddyn does not declare"
    )
    assert "local uploads nothing (its clients never communicate)" in matrix.cell("local", "topk").notes[0]
    fedsc_central = matrix.cell("fedsc", "central_dp")  # the bounds the refusal asked for are added, and said
    assert fedsc_central.status == DEVIATES
    assert "privacy.clip_prototypes=1.0" in fedsc_central.overrides and "privacy.sampling=fixed_size" in fedsc_central.overrides
    assert any(note.startswith("needs privacy.clip_prototypes: fedsc uploads prototypes") for note in fedsc_central.notes)
    assert matrix.cell("fedskc", "central_dp").notes == (
        "privacy.mechanism: fedskc uploads model weights per client (payload['weights']), which cannot be clipped and noised: it "
        "would be sent in the clear; set algorithm.gda_mode=fedavg",
    )
    assert matrix.cell("scaffold", "async").status == REFUSED and matrix.cell("fedavg", "async").status == SUPPORTED
    assert matrix.cell("fedproto", "regression").status == REFUSED and matrix.cell("moon", "regression").status == SUPPORTED
    assert matrix.cell("moon", "language_modeling").notes[0].startswith("data.task: moon needs one feature vector per sample")
    assert matrix.cell("hetero_ssfl", "personalised").notes == (
        "hetero_ssfl: eval.personalized does not apply (every client is linear-probed on the test set)",
    )
    assert matrix.cell("scaffold", "s3_state").status == SUPPORTED  # control variates are client state
    assert matrix.cell("fedavg", "s3_state").status == DEVIATES
    # secure aggregation follows from the uploads: summed ones yes, per-client ones no
    assert matrix.cell("fedavg", "secagg").status == SUPPORTED and matrix.cell("fedproto", "secagg").status == SUPPORTED
    assert matrix.cell("fedsc", "secagg").notes[0].startswith("privacy.secure_aggregation: fedsc uploads prototypes (payload[")


def test_the_text_table_has_a_row_of_symbols_per_algorithm_then_the_reasons(matrix):
    text = matrix_text(matrix)
    lines = text.splitlines()
    assert lines[0] == LEGEND
    header = lines[2].split()
    assert header == ["algorithm", *(feature.header for feature in FEATURES)]
    for index, name in enumerate(matrix.algorithms):
        row = lines[3 + index].split()
        assert row == [name, *(matrix.cell(name, feature.key).symbol for feature in FEATURES)]
    for name in matrix.algorithms:
        for feature in FEATURES:
            for note in matrix.cell(name, feature.key).notes:
                assert note in text


def test_fedray_algorithms_name_matrix_prints_its_cells_with_their_reasons(tmp_path, matrix):
    result = run_fedray_preloaded(["algorithms", "fedskc", "scaffold", "--matrix"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == cells_text(support_matrix(["fedskc", "scaffold"]))
    lines = result.stdout.splitlines()
    assert lines[0] == LEGEND and "fedskc:" in lines and "scaffold:" in lines
    start = lines.index("fedskc:")
    for offset, feature in enumerate(FEATURES, start=1):
        cell = matrix.cell("fedskc", feature.key)
        assert lines[start + offset].split()[: len(feature.title.split()) + 1] == [*feature.title.split(), cell.symbol]
        assert lines[start + offset].endswith("; ".join(cell.notes))
    refused = run_fedray_preloaded(["algorithms", "fedavg", "--matrix", "--format", "yaml"], tmp_path)
    assert refused.returncode == 2 and "--matrix: prints text only" in refused.stderr
