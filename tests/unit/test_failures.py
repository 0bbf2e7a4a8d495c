"""Cluster MTBF from per-unit MTBFs, faults per day, published runs and presets."""

from __future__ import annotations

import math

import pytest

from ckptbench.errors import ConfigError, UsageError
from ckptbench.model import presets
from ckptbench.model.failures import MAX_COUNT, MIN_WEIBULL_SHAPE, FailureModel, FailurePreset

HOUR = 3600.0


def test_system_mtbf_is_unit_mtbf_over_count() -> None:
    # MLCommons: 50,000 h per accelerator on 100,000 accelerators -> a failure every half-hour.
    model = FailureModel.from_unit_mtbf(50_000 * HOUR, 100_000)
    assert model.mtbf_s == pytest.approx(0.5 * HOUR)
    assert model.faults_per_day == pytest.approx(48)


def test_faults_per_day() -> None:
    assert FailureModel.from_faults_per_day(1).mtbf_s == 86400
    assert FailureModel.from_faults_per_day(4).mtbf_s == 6 * HOUR


def test_published_run_llama3() -> None:
    # 419 unexpected interruptions in 54 days on 16,384 H100: one every 3.09 hours.
    model = FailureModel.from_run(419, 54, 16384)
    assert model.mtbf_s / HOUR == pytest.approx(54 * 24 / 419)
    assert model.mtbf_s / HOUR == pytest.approx(3.093, abs=1e-3)
    # Half the GPUs fail half as often.
    assert FailureModel.from_run(419, 54, 16384, scale_to_gpus=8192).mtbf_s == pytest.approx(2 * model.mtbf_s)


def test_weibull_scale_keeps_the_mean() -> None:
    assert FailureModel(1000.0).weibull_scale_s == pytest.approx(1000.0)
    model = FailureModel(1000.0, weibull_shape=2.0)
    assert model.weibull_scale_s * math.gamma(1.5) == pytest.approx(1000.0)


def test_weibull_shapes_too_bursty_to_simulate_are_refused_saying_why() -> None:
    # Gamma(1 + 1/k) overflows below k = 0.0058 (an OverflowError, not a message); far above that the
    # spread already defeats any simulation: at k = 0.1 the standard deviation is 430 times the mean.
    assert math.sqrt(math.gamma(1 + 2 / MIN_WEIBULL_SHAPE) / math.gamma(1 + 1 / MIN_WEIBULL_SHAPE) ** 2 - 1) == (
        pytest.approx(430, abs=1))
    for shape in (0.001, 0.05):
        with pytest.raises(UsageError, match=rf"Weibull shape {shape:g} is below 0.1: .* 430 times its mean"):
            FailureModel(3 * HOUR, weibull_shape=shape)
    with pytest.raises(UsageError, match="weibull_shape 0.001 is below 0.1"):
        FailurePreset("bursty", faults_per_day=1, weibull_shape=0.001)
    assert FailureModel(3 * HOUR, weibull_shape=MIN_WEIBULL_SHAPE).weibull_scale_s > 0


@pytest.mark.parametrize(
    "make",
    [
        lambda: FailureModel.from_unit_mtbf(50_000 * HOUR, 10**400),
        lambda: FailureModel.from_unit_mtbf(5_000 * HOUR, 10**400, unit="node"),
        lambda: FailureModel.from_run(419, 54, 16384, scale_to_gpus=10**400),
        lambda: FailureModel.from_run(10**400, 54, 16384),
        lambda: FailurePreset("llama3", interruptions=419, days=54, gpus=16384).model(10**400),
        lambda: FailurePreset("per-gpu", gpu_mtbf_hours=50_000).model(MAX_COUNT + 1),
    ],
)
def test_counts_too_large_for_a_float_are_refused_not_overflowed(make) -> None:
    # 10^400 GPUs used to raise OverflowError (int too large to convert to float) from M / N.
    with pytest.raises(UsageError, match=r"is more than 100,000,000, the most accepted"):
        make()
    assert FailureModel.from_unit_mtbf(50_000 * HOUR, MAX_COUNT).mtbf_s == pytest.approx(1.8)


@pytest.mark.parametrize(
    "make",
    [
        lambda: FailureModel(0),
        lambda: FailureModel(-5),
        lambda: FailureModel(100, weibull_shape=0),
        lambda: FailureModel.from_unit_mtbf(50_000 * HOUR, 0),
        lambda: FailureModel.from_faults_per_day(0),
        lambda: FailureModel.from_run(0, 54, 16384),
    ],
)
def test_bad_values_are_usage_errors(make) -> None:
    with pytest.raises(UsageError):
        make()


def test_infinite_values_are_called_infinite_not_negative() -> None:
    with pytest.raises(UsageError, match="MTBF .* inf must be finite"):
        FailureModel(math.inf)
    with pytest.raises(UsageError, match="faults per day inf must be finite"):
        FailureModel.from_faults_per_day(math.inf)
    with pytest.raises(UsageError, match="faults per day -1 must be a positive number"):
        FailureModel.from_faults_per_day(-1)


def test_presets_exist_with_sources() -> None:
    names = presets.preset_names("failures")
    assert {"llama3", "mlcommons", "one-per-day"} <= set(names)
    for name in names:
        text = (presets.configs_dir() / "failures" / f"{name}.toml").read_text()
        assert "# Source" in text or "rule of thumb" in text


def test_llama3_preset_scales_with_gpus() -> None:
    preset = presets.load_failures("llama3")
    assert preset.model().mtbf_s / HOUR == pytest.approx(54 * 24 / 419)
    assert preset.model(gpus=16384 * 2).mtbf_s / HOUR == pytest.approx(54 * 24 / 419 / 2)
    assert "llama3" in preset.model().source


def test_mlcommons_preset_needs_a_gpu_count() -> None:
    preset = presets.load_failures("mlcommons")
    with pytest.raises(UsageError, match="--gpus"):
        preset.model()
    assert preset.model(gpus=100_000).mtbf_s == pytest.approx(1800)


def test_one_per_day_ignores_the_gpu_count() -> None:
    preset = presets.load_failures("one-per-day")
    assert not preset.scales_with_gpus
    assert preset.model(gpus=4000).mtbf_s == preset.model().mtbf_s == 86400
    assert "not scaled" in preset.model(gpus=4000).source


def test_preset_must_be_exactly_one_kind() -> None:
    with pytest.raises(UsageError, match="exactly one"):
        FailurePreset("both", gpu_mtbf_hours=50_000, faults_per_day=1)
    with pytest.raises(UsageError, match="exactly one"):
        FailurePreset("none")
    with pytest.raises(UsageError, match="needs all"):
        FailurePreset("partial", interruptions=10, days=3)


def test_unknown_failure_preset_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="nosuch") as info:
        presets.load_failures("nosuch")
    assert "llama3" in str(info.value)


def test_preset_weibull_shape_is_carried(tmp_path, monkeypatch) -> None:
    (tmp_path / "failures").mkdir()
    (tmp_path / "failures" / "bursty.toml").write_text("faults_per_day = 2\nweibull_shape = 0.7\n")
    monkeypatch.setattr(presets, "configs_dir", lambda: tmp_path)
    model = presets.load_failures("bursty").model()
    assert model.weibull_shape == 0.7
    assert model.mtbf_s == 43200
