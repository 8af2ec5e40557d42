"""The run view of a differentially private run (docs/guide/privacy.md) in headless Chromium: next to
accuracy and loss, the ε the accountant spent after each round; a run without privacy has no such plot."""

from __future__ import annotations

import pytest
from test_dashboard_browser import needs_browser, open_dashboard, wait_count
from test_dashboard_data import serve
from test_privacy_reporting import ROUNDS, expected_epsilons, fedray_run, private_run  # noqa: F401 (a fixture)


@needs_browser
def test_the_run_view_draws_the_epsilon_spent_after_each_round(page, private_run):  # noqa: F811 (the fixture)
    _, run_dir = private_run
    with serve(run_dir) as server:
        open_dashboard(page, server)
        wait_count(page, "#run-privacy-plot .scatterlayer .trace .point", ROUNDS)
        assert page.evaluate("document.getElementById('run-privacy-plot').data[0].y") == pytest.approx(expected_epsilons(ROUNDS))
        assert page.evaluate("document.getElementById('run-privacy-plot').hidden") is False


@needs_browser
def test_a_run_without_privacy_has_no_epsilon_plot(page, tmp_path):
    result, run_dir = fedray_run(tmp_path, ["train.rounds=1", "privacy.mechanism=none"])
    assert result.returncode == 0, result.stderr[-3000:]
    with serve(run_dir) as server:
        open_dashboard(page, server)
        wait_count(page, "#run-accuracy-plot .scatterlayer .trace .point", 1)
        assert page.evaluate("document.getElementById('run-privacy-plot').hidden") is True
