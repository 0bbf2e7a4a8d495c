"""Checkpoint size from a parameter count and a training recipe, and how it splits across ranks.

Bytes per parameter (docs/ARCHITECTURE.md, "The model"):

=====================  =======================================================
weights                bf16 2, fp16 2, fp32 4, fp8 1 (the dtype they train in)
fp32 master weights    4 (mixed precision keeps an fp32 copy; none when weights are fp32)
optimizer state        Adam/AdamW m + v in fp32: 8; SGD momentum: 4; none: 0
fp32 gradients         4, only if the checkpoint saves them (most do not)
=====================  =======================================================

A full training checkpoint of a bf16 model with Adam is therefore 2 + 4 + 8 = 14 bytes per
parameter; ``weights_only`` keeps just the weights (2 bytes per parameter in bf16).

Sharding: tensor (``tp``) and pipeline (``pp``) parallelism split every tensor ``tp * pp`` ways.
Across ``dp`` data-parallel ranks, ZeRO-1 shards optimizer state and master weights, ZeRO-2 also
gradients, ZeRO-3 and FSDP (full shard) also the weights. State that stays replicated across
data-parallel ranks is written once, so the total is the same for every layout; what changes is
how many ranks write and how much the busiest one writes.

Who writes the replicated state depends on the writer. Here one data-parallel rank (rank 0) writes
all of it, as DeepSpeed's model-states file and torch.distributed.checkpoint with
``dedup_save_to_lowest_rank=True`` do, so ``per_rank_max_bytes`` is an upper bound for the busiest
rank. torch.distributed.checkpoint's default (``dedup_save_plans(save_to_lowest_rank=False)``)
gives each replicated item to the replica with the least planned bytes so far, which spreads it
about evenly: the busiest rank then writes about ``total / ranks``, plus at most its largest tensor.
The bound is kept because it is the conservative figure for a pre-flight check and does not depend
on tensor sizes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ckptbench.errors import UsageError
from ckptbench.model import _checks

#: Bytes per parameter of the weights, by training dtype.
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
#: Bytes per parameter of fp32 optimizer state.
OPTIMIZER_BYTES: dict[str, int] = {"adam": 8, "sgd": 4, "none": 0}
MASTER_WEIGHT_BYTES = 4
GRADIENT_BYTES = 4
#: Data-parallel sharding schemes; ``fsdp`` means FULL_SHARD, which shards like ZeRO-3.
SHARDING: tuple[str, ...] = ("none", "zero1", "zero2", "zero3", "fsdp")


@dataclass(frozen=True)
class TrainingRecipe:
    """What a checkpoint holds per parameter.

    ``master_weights=None`` means "what mixed precision does": an fp32 master copy whenever the
    weights are not fp32. ``weights_only=True`` keeps only the weights, whatever the other fields say
    (the CLI rejects combining it with an explicit optimizer or gradients).
    """

    weights_dtype: str = "bf16"
    optimizer: str = "adam"
    master_weights: bool | None = None
    gradients: bool = False
    weights_only: bool = False

    def __post_init__(self) -> None:
        _checks.one_of("weights dtype", self.weights_dtype, tuple(DTYPE_BYTES))
        _checks.one_of("optimizer", self.optimizer, tuple(OPTIMIZER_BYTES))

    @property
    def has_master_weights(self) -> bool:
        if self.weights_only:
            return False
        if self.master_weights is None:
            return self.weights_dtype != "fp32"
        return self.master_weights

    def bytes_per_param(self) -> dict[str, int]:
        """Bytes per parameter of each component: ``weights``, ``master_weights``, ``optimizer``, ``gradients``."""
        if self.weights_only:
            return {"weights": DTYPE_BYTES[self.weights_dtype], "master_weights": 0, "optimizer": 0, "gradients": 0}
        return {
            "weights": DTYPE_BYTES[self.weights_dtype],
            "master_weights": MASTER_WEIGHT_BYTES if self.has_master_weights else 0,
            "optimizer": OPTIMIZER_BYTES[self.optimizer],
            "gradients": GRADIENT_BYTES if self.gradients else 0,
        }

    def describe(self) -> str:
        """``"bf16 weights + fp32 master + adam (fp32 m, v)"``."""
        if self.weights_only:
            return f"{self.weights_dtype} weights only"
        parts = [f"{self.weights_dtype} weights"]
        if self.has_master_weights:
            parts.append("fp32 master")
        if self.optimizer == "adam":
            parts.append("Adam (fp32 m, v)")
        elif self.optimizer == "sgd":
            parts.append("SGD momentum (fp32)")
        if self.gradients:
            parts.append("fp32 gradients")
        return " + ".join(parts)


@dataclass(frozen=True)
class Parallelism:
    """How the job is split: ``dp`` data-parallel ranks (with ``sharding``), ``tp`` tensor, ``pp`` pipeline."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    sharding: str = "none"

    def __post_init__(self) -> None:
        _checks.positive_int("data-parallel size", self.dp)
        _checks.positive_int("tensor-parallel size", self.tp)
        _checks.positive_int("pipeline-parallel size", self.pp)
        _checks.one_of("sharding", self.sharding, SHARDING)

    @property
    def ranks(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp

    def sharded_components(self) -> frozenset[str]:
        """Components split across data-parallel ranks (the rest are written by data-parallel rank 0)."""
        if self.dp == 1 or self.sharding == "none":
            return frozenset()
        if self.sharding == "zero1":
            return frozenset({"master_weights", "optimizer"})
        if self.sharding == "zero2":
            return frozenset({"master_weights", "optimizer", "gradients"})
        return frozenset({"weights", "master_weights", "optimizer", "gradients"})


@dataclass(frozen=True)
class CheckpointSize:
    """The size of one checkpoint, in total and per rank.

    ``total_bytes`` is what lands on storage (replicated state counted once). ``per_rank_max_bytes``
    is what the busiest rank writes when data-parallel rank 0 writes all replicated state: an upper
    bound (see the module docstring for writers that balance it). ``per_rank_min_bytes`` is what every
    other rank writes then, and ``writer_ranks`` how many ranks write anything.
    """

    params: float
    recipe: TrainingRecipe
    parallelism: Parallelism
    component_bytes: dict[str, int] = field(hash=False)
    total_bytes: int
    per_rank_max_bytes: int
    per_rank_min_bytes: int
    writer_ranks: int

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (units in the key names)."""
        return {
            "params": self.params,
            "recipe": asdict(self.recipe) | {"description": self.recipe.describe()},
            "parallelism": asdict(self.parallelism),
            "bytes_per_param": self.recipe.bytes_per_param(),
            "component_bytes": dict(self.component_bytes),
            "total_bytes": self.total_bytes,
            "per_rank_max_bytes": self.per_rank_max_bytes,
            "per_rank_min_bytes": self.per_rank_min_bytes,
            "writer_ranks": self.writer_ranks,
            "ranks": self.parallelism.ranks,
        }


def checkpoint_size(
    params: float,
    recipe: TrainingRecipe | None = None,
    parallelism: Parallelism | None = None,
) -> CheckpointSize:
    """Bytes of one checkpoint of a ``params``-parameter model: total and per rank.

    ``total = params * sum(bytes_per_param)``. Per rank: every component is divided by ``tp * pp``;
    components the sharding scheme splits are further divided by ``dp``; the others are written by
    data-parallel rank 0 only. Assumes an even split (real layouts differ by a few percent at most).
    Raises ``UsageError`` when the checkpoint would be 0 bytes or not a finite number of bytes.
    """
    _checks.positive("parameter count", params)
    recipe = recipe or TrainingRecipe()
    parallelism = parallelism or Parallelism()
    per_param = recipe.bytes_per_param()
    bytes_per_param = sum(per_param.values())
    if not math.isfinite(params * bytes_per_param):
        raise UsageError(f"parameter count {params:g} x {bytes_per_param} bytes per parameter is not a finite size")
    component_bytes = {name: round(params * nbytes) for name, nbytes in per_param.items()}
    total = sum(component_bytes.values())
    if total == 0:
        raise UsageError(
            f"parameter count {params:g} gives a checkpoint of 0 bytes ({recipe.describe()}: "
            f"{bytes_per_param} bytes per parameter, rounded to whole bytes)",
        )
    sharded = parallelism.sharded_components()
    mp, dp = parallelism.model_parallel, parallelism.dp
    sharded_bytes = sum(b for name, b in component_bytes.items() if name in sharded)
    replicated_bytes = total - sharded_bytes
    per_rank_sharded = math.ceil(sharded_bytes / (mp * dp))
    rank0 = per_rank_sharded + math.ceil(replicated_bytes / mp)
    if sharded_bytes and dp > 1:
        others, writers = per_rank_sharded, parallelism.ranks
    else:
        others, writers = 0, mp
    if dp == 1:
        others = rank0
    return CheckpointSize(
        params=float(params),
        recipe=recipe,
        parallelism=parallelism,
        component_bytes=component_bytes,
        total_bytes=total,
        per_rank_max_bytes=rank0,
        per_rank_min_bytes=others,
        writer_ranks=writers,
    )


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer in the Llama layout (GQA attention, SwiGLU MLP, RMSNorm, no biases).

    ``params`` is the published count; :meth:`params_from_shape` recomputes it from the shape, and
    :meth:`tensor_shapes` lists every weight tensor with Hugging Face names, so a checkpoint workload
    can be built with realistic tensor sizes.
    """

    name: str
    params: float
    layers: int
    hidden: int
    ffn_hidden: int
    vocab: int
    heads: int
    kv_heads: int
    tied_embeddings: bool = False
    description: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        _checks.positive(f"model {self.name!r}: params", self.params)
        for name in ("layers", "hidden", "ffn_hidden", "vocab", "heads", "kv_heads"):
            _checks.positive_int(f"model {self.name!r}: {name}", getattr(self, name))
        if self.hidden % self.heads:
            raise UsageError(f"model {self.name!r}: hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.heads % self.kv_heads:
            raise UsageError(f"model {self.name!r}: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def tensor_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every weight tensor ``(name, shape)`` in state_dict order (Hugging Face Llama names)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        q = self.heads * self.head_dim
        tensors: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab, h))]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            tensors += [
                (p + "self_attn.q_proj.weight", (q, h)),
                (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)),
                (p + "self_attn.o_proj.weight", (h, q)),
                (p + "mlp.gate_proj.weight", (self.ffn_hidden, h)),
                (p + "mlp.up_proj.weight", (self.ffn_hidden, h)),
                (p + "mlp.down_proj.weight", (h, self.ffn_hidden)),
                (p + "input_layernorm.weight", (h,)),
                (p + "post_attention_layernorm.weight", (h,)),
            ]
        tensors.append(("model.norm.weight", (h,)))
        if not self.tied_embeddings:
            tensors.append(("lm_head.weight", (self.vocab, h)))
        return tensors

    def params_from_shape(self) -> int:
        """The parameter count implied by the shape (sum over :meth:`tensor_shapes`)."""
        return sum(math.prod(shape) for _, shape in self.tensor_shapes())
