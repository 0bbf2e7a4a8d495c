"""GPU presets (configs/gpus) and the model presets' [training] tables: every one loads, states its source,
and a bad value is refused naming the preset."""

from __future__ import annotations

import pytest

from ckptbench.errors import ConfigError
from ckptbench.model import presets


@pytest.mark.parametrize("name", presets.preset_names("gpus"))
def test_every_gpu_preset_loads_with_a_source(name):
    gpu = presets.load_gpu(name)
    assert 100 <= gpu.peak_tflops <= 10_000 and "datasheet" in gpu.source


@pytest.mark.parametrize("name", presets.preset_names("models"))
def test_every_model_loads_and_its_training_defaults_name_a_known_gpu(name):
    presets.load_model(name)  # the [training] table is not part of the shape
    training = presets.load_training(name)
    if training.gpu is not None:
        presets.load_gpu(training.gpu)
        assert training.source


def test_the_llama3_presets_carry_the_papers_run():
    assert presets.load_training("llama3-405b").tokens == 15.6e12
    assert presets.load_training("dense-100b").tokens is None  # not a published model: nothing to default


@pytest.mark.parametrize("bad", [{"peak_tflops": 0}, {"peak_tflops": True}, {"peak_tflops": "989"}])
def test_a_bad_peak_is_refused(bad):
    with pytest.raises(ConfigError, match="gpu preset 'x'"):
        presets.GpuPreset(name="x", **bad)


@pytest.mark.parametrize("bad", [{"mfu": 1.5}, {"tokens": -1}])
def test_bad_training_defaults_are_refused(bad):
    with pytest.raises(ConfigError, match="model preset 'x'"):
        presets.TrainingDefaults(name="x", **bad)
