"""Checkpoint sizing: bytes per parameter by recipe, sharding across ranks, model presets."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptbench.errors import ConfigError, UsageError
from ckptbench.model import presets
from ckptbench.model.sizing import SHARDING, ModelShape, Parallelism, TrainingRecipe, checkpoint_size


@pytest.mark.parametrize(
    ("recipe", "bytes_per_param"),
    [
        (TrainingRecipe(), 14),  # bf16 2 + fp32 master 4 + Adam m, v 8
        (TrainingRecipe(weights_dtype="fp16"), 14),
        (TrainingRecipe(weights_dtype="fp8"), 13),
        (TrainingRecipe(weights_dtype="fp32"), 12),  # fp32 weights are their own master copy
        (TrainingRecipe(optimizer="sgd"), 10),
        (TrainingRecipe(optimizer="none"), 6),
        (TrainingRecipe(gradients=True), 18),
        (TrainingRecipe(master_weights=False), 10),
        (TrainingRecipe(weights_only=True), 2),
        (TrainingRecipe(weights_dtype="fp32", weights_only=True), 4),
        (TrainingRecipe(weights_only=True, gradients=True, optimizer="adam"), 2),  # weights_only wins
    ],
)
def test_bytes_per_param_by_recipe(recipe: TrainingRecipe, bytes_per_param: int) -> None:
    assert sum(recipe.bytes_per_param().values()) == bytes_per_param
    assert checkpoint_size(1e9, recipe).total_bytes == bytes_per_param * 10**9


def test_70b_bf16_adam_is_980_gb_and_weights_140_gb() -> None:
    assert checkpoint_size(70e9).total_bytes == 980 * 10**9
    assert checkpoint_size(70e9, TrainingRecipe(weights_only=True)).total_bytes == 140 * 10**9


def test_components_add_up() -> None:
    size = checkpoint_size(7e9, TrainingRecipe(gradients=True))
    assert size.component_bytes == {
        "weights": 14 * 10**9, "master_weights": 28 * 10**9, "optimizer": 56 * 10**9, "gradients": 28 * 10**9,
    }
    assert size.total_bytes == sum(size.component_bytes.values())


def test_replicated_data_parallel_state_is_written_by_rank_zero_only() -> None:
    size = checkpoint_size(1e9, parallelism=Parallelism(dp=8))
    assert size.total_bytes == 14 * 10**9
    assert size.per_rank_max_bytes == 14 * 10**9
    assert size.per_rank_min_bytes == 0
    assert size.writer_ranks == 1


def test_zero1_shards_master_and_optimizer_only() -> None:
    size = checkpoint_size(1e9, parallelism=Parallelism(dp=8, sharding="zero1"))
    # weights 2 GB replicated (rank 0 writes them) + (4 + 8) GB / 8 per rank
    assert size.per_rank_min_bytes == 1.5e9
    assert size.per_rank_max_bytes == 3.5e9
    assert size.writer_ranks == 8


def test_zero2_also_shards_gradients() -> None:
    size = checkpoint_size(1e9, TrainingRecipe(gradients=True), Parallelism(dp=4, sharding="zero2"))
    assert size.per_rank_min_bytes == (4 + 8 + 4) * 1e9 / 4
    assert size.per_rank_max_bytes == 2e9 + (4 + 8 + 4) * 1e9 / 4


@pytest.mark.parametrize("scheme", ["zero3", "fsdp"])
def test_full_sharding_splits_everything_evenly(scheme: str) -> None:
    size = checkpoint_size(1e9, parallelism=Parallelism(dp=8, sharding=scheme))
    assert size.per_rank_max_bytes == size.per_rank_min_bytes == 14e9 / 8


def test_tensor_and_pipeline_parallel_split_every_tensor() -> None:
    size = checkpoint_size(8e9, parallelism=Parallelism(tp=2, pp=4))
    assert size.writer_ranks == 8
    assert size.per_rank_max_bytes == size.per_rank_min_bytes == 14e9


@given(
    params=st.floats(1e6, 1e12),
    dp=st.integers(1, 64), tp=st.integers(1, 8), pp=st.integers(1, 8),
    sharding=st.sampled_from(SHARDING),
)
def test_total_does_not_depend_on_layout_and_ranks_cover_it(
    params: float, dp: int, tp: int, pp: int, sharding: str,
) -> None:
    layout = Parallelism(dp=dp, tp=tp, pp=pp, sharding=sharding)
    size = checkpoint_size(params, parallelism=layout)
    assert size.total_bytes == checkpoint_size(params).total_bytes
    mp = tp * pp
    written = mp * size.per_rank_max_bytes + mp * (dp - 1) * size.per_rank_min_bytes
    # Every byte is written by some rank; per-rank sizes are rounded up, at most 2 bytes per rank.
    assert size.total_bytes <= written <= size.total_bytes + 2 * layout.ranks
    # per_rank_max_bytes is an upper bound for the busiest rank: however a writer spreads the replicated
    # state (torch.distributed.checkpoint balances it), some rank writes at least total / ranks.
    assert size.per_rank_max_bytes >= math.ceil(size.total_bytes / layout.ranks)


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"weights_dtype": "int4"}, "int4"),
        ({"optimizer": "lion"}, "lion"),
    ],
)
def test_bad_recipe_names_the_value(kwargs: dict, word: str) -> None:
    with pytest.raises(UsageError, match=word):
        TrainingRecipe(**kwargs)


def test_bad_layout_and_params_name_the_value() -> None:
    with pytest.raises(UsageError, match="data-parallel size 0 must be"):
        Parallelism(dp=0)
    with pytest.raises(UsageError, match="zero4"):
        Parallelism(sharding="zero4")
    with pytest.raises(UsageError, match="parameter count -5 must be a positive number"):
        checkpoint_size(-5)
    with pytest.raises(UsageError, match="parameter count inf must be finite"):
        checkpoint_size(math.inf)


def test_a_checkpoint_that_rounds_to_zero_bytes_says_so() -> None:
    with pytest.raises(UsageError, match=r"parameter count 0\.001 gives a checkpoint of 0 bytes .*14 bytes per param"):
        checkpoint_size(1e-3)
    assert checkpoint_size(1.0).total_bytes == 14


def test_a_checkpoint_too_large_to_count_says_so() -> None:
    with pytest.raises(UsageError, match=r"parameter count 1e\+308 x 14 bytes per parameter is not a finite size"):
        checkpoint_size(1e308)


# -- model presets ------------------------------------------------------------------------------------


def test_required_model_presets_exist() -> None:
    assert {"llama3-8b", "llama3-70b", "llama3-405b", "dense-100b"} <= set(presets.preset_names("models"))


@pytest.mark.parametrize("name", presets.preset_names("models"))
def test_model_preset_shape_matches_its_parameter_count(name: str) -> None:
    shape = presets.load_model(name)
    assert shape.name == name
    assert shape.params_from_shape() == shape.params  # exact: one layer more or less is ~1 % off
    names = [n for n, _ in shape.tensor_shapes()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("name", "params"),
    [
        # The counts published with the Hugging Face weights (8.03B, 70.6B, 405B) and the 100B preset's own.
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("llama3-405b", 405_853_388_800),
        ("dense-100b", 101_613_905_920),
    ],
)
def test_model_preset_parameter_counts_are_exact(name: str, params: int) -> None:
    shape = presets.load_model(name)
    assert shape.params == params
    assert shape.params_from_shape() == params


def test_llama3_8b_tensor_list_is_the_published_layout() -> None:
    shape = presets.load_model("llama3-8b")
    tensors = dict(shape.tensor_shapes())
    assert len(tensors) == 2 + 32 * 9 + 1  # embeddings, 9 per layer, final norm, lm_head
    assert tensors["model.embed_tokens.weight"] == (128256, 4096)
    assert tensors["model.layers.0.self_attn.k_proj.weight"] == (1024, 4096)  # 8 KV heads x 128
    assert tensors["model.layers.31.mlp.down_proj.weight"] == (4096, 14336)
    assert shape.params_from_shape() == 8_030_261_248


def test_tied_embeddings_drop_the_lm_head() -> None:
    untied = ModelShape("m", 1e6, 2, 64, 128, 100, 4, 2)
    tied = ModelShape("m", 1e6, 2, 64, 128, 100, 4, 2, tied_embeddings=True)
    assert untied.params_from_shape() - tied.params_from_shape() == 100 * 64


def test_inconsistent_shape_is_rejected() -> None:
    with pytest.raises(UsageError, match="heads"):
        ModelShape("bad", 1e9, 2, 100, 400, 1000, 3, 1)


def test_unknown_model_preset_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="llama3-9b") as info:
        presets.load_model("llama3-9b")
    assert "llama3-8b" in str(info.value)


def test_model_preset_with_unknown_key_is_rejected(tmp_path, monkeypatch) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "odd.toml").write_text(
        "params = 1e9\nlayers = 2\nhidden = 64\nffn_hidden = 128\nvocab = 100\nheads = 4\nkv_heads = 2\nexperts = 8\n",
    )
    monkeypatch.setattr(presets, "configs_dir", lambda: tmp_path)
    with pytest.raises(ConfigError, match="experts"):
        presets.load_model("odd")


def test_configs_dir_falls_back_to_the_repository() -> None:
    directory = presets.configs_dir()
    assert (directory / "models" / "llama3-70b.toml").is_file()
    assert math.isfinite(presets.load_model("llama3-70b").params)
