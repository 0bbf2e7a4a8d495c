"""``ckptbench interval`` with two levels: JSON, human output, --explain, presets and one-line errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ckptbench.cli import main

TWO_LEVEL = ("--stall", "2s", "--persist", "60s", "--mtbf", "6h", "--restart", "5m",
             "--remote-ckpt-time", "10m", "--remote-restart", "15m")


def run(*args: str):
    return CliRunner().invoke(main, ["interval", *args])


def run_json(*args: str) -> dict:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_json_levels_local_first_and_both_wastes() -> None:
    two = run_json(*TWO_LEVEL, "--local-loss", "30%")["two_level"]
    assert two["schedule"] == "two-level"
    local, remote = two["levels"]
    assert local["name"] == "local" and local["every"] == 1
    assert remote["name"] == "remote" and remote["every"] >= 2
    assert remote["interval_s"] == pytest.approx(remote["every"] * local["interval_s"])
    assert 0 < two["waste_fraction"] < two["single_level_waste_fraction"] < 1
    assert two["local_loss"] == 0.3
    assert two["remote_restart_s"] == 900 and two["local_restart_s"] == 300
    low, high = two["two_level_schedule"]["interval_plateau_s"]
    assert low <= local["interval_s"] <= high
    assert low <= two["two_level_schedule"]["recommended_interval_s"] <= high
    k_low, k_high = two["two_level_schedule"]["every_tied"]
    assert k_low <= remote["every"] <= k_high
    assert two["benoit"]["every"] >= 1
    assert two["simulation"] is None


def test_without_remote_options_there_is_no_two_level_answer() -> None:
    assert run_json("--ckpt-time", "5m", "--mtbf", "24h")["two_level"] is None


def test_simulate_checks_the_two_level_optimum() -> None:
    doc = run_json(*TWO_LEVEL, "--local-loss", "30%", "--simulate", "500", "--work", "10d")
    sim = doc["two_level"]["simulation"]
    assert sim["runs"] == 500
    assert sim["every"] == doc["two_level"]["levels"][1]["every"]
    assert sim["waste_fraction"] == pytest.approx(sim["model_waste_fraction"], abs=5 * sim["stderr_waste_fraction"])
    assert abs(sim["z_score"]) < 4
    assert sim["remote_restarts_per_run"] > 0


def test_total_local_loss_degenerates_to_remote_only() -> None:
    two = run_json(*TWO_LEVEL, "--local-loss", "100%")["two_level"]
    assert two["schedule"] == "remote-only"
    assert [level["name"] for level in two["levels"]] == ["remote"]
    assert two["waste_fraction"] == two["single_level_waste_fraction"]
    assert two["two_level_schedule"]["waste_fraction"] > two["single_level_waste_fraction"]


def test_no_local_loss_degenerates_to_local_only() -> None:
    doc = run_json(*TWO_LEVEL, "--local-loss", "0")
    two = doc["two_level"]
    assert two["schedule"] == "local-only"
    assert two["levels"][1]["every"] is None
    # the local-only answer is the single-level one for the local checkpoint
    assert two["waste_fraction"] == pytest.approx(doc["waste_fraction"])
    assert two["levels"][0]["interval_s"] == pytest.approx(doc["optimal_interval_s"])


def test_local_loss_preset_comes_from_the_llama3_breakdown() -> None:
    two = run_json(*TWO_LEVEL, "--local-loss", "llama3")["two_level"]
    assert two["local_loss"] == pytest.approx(283 / 419, abs=1e-3)
    assert "llama3" in two["local_loss_source"]
    # --failures llama3 gives it by default
    doc = run_json("--stall", "2s", "--persist", "60s", "--failures", "llama3", "--restart", "5m",
                   "--remote-ckpt-time", "10m")
    assert doc["two_level"]["local_loss"] == pytest.approx(0.675)


def test_peer_replica_what_if_lowers_the_loss_and_the_waste() -> None:
    base = run_json(*TWO_LEVEL, "--local-loss", "llama3")["two_level"]
    peer = run_json(*TWO_LEVEL, "--local-loss", "llama3", "--peer-replica", "--nodes", "256")["two_level"]
    assert peer["local_loss"] < base["local_loss"] / 100
    assert peer["peer_replica"]["nodes"] == 256
    assert peer["waste_fraction"] < base["waste_fraction"]
    assert peer["levels"][1]["every"] > base["levels"][1]["every"]


def test_every_and_remote_every_are_evaluated() -> None:
    two = run_json(*TWO_LEVEL, "--local-loss", "30%", "--every", "10m", "--remote-every", "4")["two_level"]
    at = two["at_interval"]
    assert at["interval_s"] == 600 and at["every"] == 4
    assert at["waste_fraction"] >= two["two_level_schedule"]["waste_fraction"]


def test_human_output_compares_the_schedules_in_a_table_and_one_sentence() -> None:
    result = run(*TWO_LEVEL, "--local-loss", "30%")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "Single level versus two levels" in out
    assert "remote only (single level)" in out and "two levels (optimum)" in out and "Benoit" in out
    last = out.strip().splitlines()[-2:]
    assert "drain every" in " ".join(last) and "points saved" in " ".join(last)


def test_explain_documents_the_two_level_formulas() -> None:
    result = run("--explain")
    assert result.exit_code == 0
    assert "Two levels" in result.stdout and "Benoit" in result.stdout and "--peer-replica" in result.stdout


@pytest.mark.parametrize("args", [
    pytest.param(("--remote-every", "0", "--every", "10m", "--local-loss", "30%"), id="remote-every-0"),
    pytest.param(("--local-loss", "150%"), id="local-loss-150"),
    pytest.param(("--local-loss", "mlcommons"), id="preset-without-share"),
    pytest.param(("--local-loss", "lots"), id="local-loss-not-a-fraction"),
    pytest.param(("--local-loss", "30%", "--remote-every", "3"), id="remote-every-without-every"),
    pytest.param(("--local-loss", "30%", "--peer-replica"), id="peer-without-nodes"),
    pytest.param((), id="no-local-loss"),
])
def test_bad_two_level_input_is_one_line_exit_2(args: tuple[str, ...]) -> None:
    result = run(*TWO_LEVEL, *args)
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [
    pytest.param(("--ckpt-time", "30s", "--remote-ckpt-time", "10m", "--local-loss", "30%"), id="no-failure-rate"),
    pytest.param(("--mtbf", "6h", "--remote-ckpt-time", "10m", "--local-loss", "30%"), id="no-local-cost"),
    pytest.param(("--ckpt-time", "30s", "--mtbf", "6h", "--local-loss", "30%"), id="remote-option-without-drain"),
])
def test_remote_options_without_what_they_need_are_one_line_exit_2(args: tuple[str, ...]) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize(("loss", "sentence"), [
    ("100%", "Two levels do not pay here"),
    ("0", "No failure loses the local copy"),
])
def test_human_takeaway_names_the_degenerate_schedules(loss: str, sentence: str) -> None:
    result = run(*TWO_LEVEL, "--local-loss", loss)
    assert result.exit_code == 0, result.stderr
    assert sentence in " ".join(result.stdout.split())


def test_weibull_simulation_has_no_z_score_against_the_exponential_model() -> None:
    sim = run_json(*TWO_LEVEL, "--local-loss", "30%", "--simulate", "300", "--work", "5d",
                   "--weibull-shape", "0.7")["two_level"]["simulation"]
    assert sim["weibull_shape"] == 0.7
    assert sim["z_score"] is None
    assert 0 < sim["waste_fraction"] < 1


@pytest.mark.parametrize("loss", ["30%", "0%", "100%"])
def test_plot_draws_both_schedules(tmp_path, loss: str) -> None:
    from matplotlib.image import imread

    path = tmp_path / "two.png"
    doc = run_json(*TWO_LEVEL, "--local-loss", loss, "--plot", str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(path).shape[1] > 600
    assert not any("single-level curve" in note for note in doc["notes"])


def test_two_level_plot_marks_the_chosen_schedule_and_both_plateaus(tmp_path) -> None:
    from matplotlib.axes import Axes

    from ckptbench.model import twolevel
    from ckptbench.model.interval import CheckpointCost
    from ckptbench.report import twolevel_plot

    two = run_json(*TWO_LEVEL, "--local-loss", "30%")["two_level"]
    drawn: dict[str, list] = {"spans": [], "points": []}
    real_span, real_plot = Axes.axvspan, Axes.plot

    def span(self, low, high, **kwargs):
        drawn["spans"].append((low * 60, high * 60, kwargs.get("label")))
        return real_span(self, low, high, **kwargs)

    def plot(self, xs, ys, *args, **kwargs):
        if len(xs) == 1:
            drawn["points"].append((xs[0] * 60, ys[0], kwargs.get("label")))
        return real_plot(self, xs, ys, *args, **kwargs)

    cost = twolevel.TwoLevelCost(CheckpointCost(2.0, 60.0, two["drain_interference"]), 600.0,
                                 two["drain_interference"], 300.0, 900.0, 0.3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Axes, "axvspan", span)
        patch.setattr(Axes, "plot", plot)
        twolevel_plot.plot_two_level_waste(tmp_path / "p.png", cost, 6 * 3600.0, two)
    best = two["two_level_schedule"]
    tau, every = best["levels"][0]["interval_s"], best["levels"][1]["every"]
    (chosen_x, chosen_y, chosen_label), (single_x, single_y, _) = drawn["points"]
    assert chosen_x == pytest.approx(tau) and chosen_y == pytest.approx(100 * best["waste_fraction"])
    assert f"k {every}" in chosen_label
    assert single_x == pytest.approx(two["remote_only_schedule"]["levels"][0]["interval_s"])
    assert single_y == pytest.approx(100 * two["single_level_waste_fraction"])
    (low, high, _), (single_low, single_high, _) = drawn["spans"]
    assert (low, high) == pytest.approx(tuple(best["interval_plateau_s"]))
    assert single_low <= single_x <= single_high


def test_the_inputs_table_says_which_restart_was_not_given() -> None:
    # Without --restart the local restart is assumed free, and the two-level table says so as the
    # single-level one does; the loss line names its source once, without nested brackets.
    args = ("--ckpt-time", "10s", "--remote-ckpt-time", "60s", "--mtbf", "3h", "--local-loss", "30%")
    unset = run(*args)
    assert unset.exit_code == 0, unset.stderr
    assert "local 0 (not given), remote 1m" in unset.stdout
    assert "restart from remote; given (--local-loss)" in unset.stdout
    given = run(*args, "--restart", "0")
    assert given.exit_code == 0 and "local 0, remote" in given.stdout and "not given" not in given.stdout
