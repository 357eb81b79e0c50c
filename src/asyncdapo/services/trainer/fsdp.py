"""Sharded data parallel for the policy: PyTorch FSDP2 (`torch.distributed.fsdp.fully_shard`).

`trainer.sharding: fsdp` shards each decoder layer and the root (embeddings, final norm, LM head)
over the data-parallel ranks: every rank holds 1/W of the fp32 master weights, of their gradients
and of AdamW's state. For compute, a layer's parameters are all-gathered in the compute dtype
(`model.dtype: bfloat16` → bf16, half the traffic and memory of fp32) just before it runs and freed
after; gradients are reduce-scattered in fp32. With `trainer.activation_checkpointing` each decoder
layer keeps only its input and recomputes the rest in backward. The memory this takes for a model
is `memory_estimate` (deploy docs: the 8B example); `trainer.sharding: ddp` replicates everything.

The update itself does not change (update.py): the loss normalisation, the micro-batch counts that
keep every rank's collectives aligned, the gradient clip (a global norm over the shards) and the
optimizer step work on the sharded parameters as they do on replicas, so one FSDP update equals
the single-process update (tests/integration/trainer/test_trainer_fsdp.py, 2 gloo processes).

Checkpoints stay in the replicated format (the plain module's state_dict and a plain AdamW
state_dict, parameters numbered in `named_parameters()` order): `Sharding.gather` collects them
from every rank on rank 0, `Sharding.loadable` scatters them back, so a run may switch between
ddp and fsdp across a restart and a checkpoint never depends on the world size.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from asyncdapo.contracts.config import ShardingStrategy, TrainerConfig
from asyncdapo.services.trainer.dist import DistContext

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import OptimizerStateType
    from transformers import PreTrainedModel


def hf_model(model: nn.Module) -> PreTrainedModel:
    """`model` as the Hugging Face model the trainer trains (a no-op): torch types a module's
    dynamic attributes as `Tensor | Module`, which hides the Hugging Face methods."""
    return cast("PreTrainedModel", model)


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (the units FSDP shards one by one)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    if not layers:
        raise ValueError(f"{type(model).__name__}: no decoder layers found to shard")
    return layers


def no_sync(model: nn.Module, last: bool) -> contextlib.AbstractContextManager[Any]:
    """Skip DDP's gradient all-reduce on all but the last micro-batch. FSDP reduce-scatters every
    micro-batch (keeping only the sharded gradient is what saves the memory)."""
    if last or not isinstance(model, nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """The global gradient norm (all shards) after clipping to `max_norm`, as a float."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if hasattr(norm, "full_tensor"):  # a DTensor: the norm of the sharded gradients
        norm = norm.full_tensor()
    return float(norm)


@dataclass
class _Layout:
    """The replicated names of the module: state_dict keys (tied aliases included) and parameters."""

    keys: list[str]
    aliases: dict[str, str]  # state_dict key -> the key of the tensor it is tied to
    params: list[str]  # named_parameters() order: a plain optimizer's parameter numbering


def _layout(model: nn.Module) -> _Layout:
    sd = model.state_dict()
    first: dict[int, str] = {}
    aliases = {}
    for key, t in sd.items():
        ptr = t.data_ptr()
        if ptr in first and t.numel() > 0:
            aliases[key] = first[ptr]
        else:
            first.setdefault(ptr, key)
    return _Layout(list(sd), aliases, [n for n, _ in model.named_parameters()])


class _StateView:
    """What CheckpointStore and publish read from a module or an optimizer — `state_dict()` (and
    `save_pretrained` for the snapshot) — over a gathered replicated state (rank 0)."""

    def __init__(
        self, state: dict[str, Any], module: nn.Module | None = None, aliases: dict[str, str] | None = None
    ) -> None:
        self._state = state
        self._module = module
        self._aliases = aliases or {}

    def state_dict(self) -> dict[str, Any]:
        return self._state

    def save_pretrained(self, *args: Any, **kwargs: Any) -> Any:
        """The Hugging Face directory, tied weights written once (as the unsharded model does)."""
        assert self._module is not None
        if "state_dict" in kwargs:
            kwargs["state_dict"] = {k: v for k, v in kwargs["state_dict"].items() if k not in self._aliases}
        return hf_model(self._module).save_pretrained(*args, **kwargs)


class _ModelLoader:
    def __init__(self, sharding: Sharding, model: nn.Module) -> None:
        self._sharding, self._model = sharding, model

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        layout = self._sharding.layout
        assert layout is not None, "the model was wrapped"
        state = {k: v for k, v in state.items() if k not in layout.aliases}
        set_model_state_dict(self._model, state, options=StateDictOptions(full_state_dict=True))


class _OptimizerLoader:
    def __init__(self, sharding: Sharding, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self._sharding, self._model, self._optimizer = sharding, model, optimizer

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        assert self._sharding.layout is not None, "the model was wrapped"
        names = self._sharding.layout.params
        by_name: OptimizerStateType = {
            "state": {names[int(i)]: s for i, s in state["state"].items()},
            "param_groups": [
                {**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]
            ],
        }
        set_optimizer_state_dict(
            self._model, self._optimizer, by_name, options=StateDictOptions(full_state_dict=True)
        )


class Sharding:
    """How the policy is spread over the data-parallel ranks (`trainer.sharding`)."""

    def __init__(self, cfg: TrainerConfig, dist: DistContext, compute_dtype: torch.dtype) -> None:
        self.strategy = cfg.sharding
        self.activation_checkpointing = cfg.activation_checkpointing
        self.dist = dist
        self.compute_dtype = compute_dtype
        self.layout: _Layout | None = None

    @property
    def sharded(self) -> bool:
        return self.strategy is ShardingStrategy.FSDP

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module the trainer trains: sharded (FSDP2), replicated (DDP, W > 1) or as is."""
        if self.activation_checkpointing:
            hf_model(model).gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if self.sharded:
            return self._fully_shard(model)
        if self.dist.world > 1:
            dev = self.dist.device
            return nn.parallel.DistributedDataParallel(
                model, device_ids=[dev.index] if dev.type == "cuda" else None
            )
        return model

    def _fully_shard(self, model: nn.Module) -> nn.Module:
        import torch.distributed as tdist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if not tdist.is_initialized():  # one process: a group of one (FSDP needs a mesh)
            backend = "gloo" if self.dist.device.type == "cpu" else "nccl"
            tdist.init_process_group(backend, store=tdist.HashStore(), rank=0, world_size=1)
        self.layout = _layout(model)
        mesh = init_device_mesh(self.dist.device.type, (self.dist.world,))
        param_dtype = None if self.compute_dtype == torch.float32 else self.compute_dtype
        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        return model

    def gather(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any] | None:
        """The replicated model and optimizer state on rank 0 (views with `state_dict()`), for a
        checkpoint or a weights snapshot. Collective: every rank calls it; other ranks get None.
        Without sharding: None everywhere (the trainer reads its replica directly)."""
        if not self.sharded:
            return None
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        assert self.layout is not None
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        msd = get_model_state_dict(model, options=opts)
        # full_state_dict: parameters keyed by name (torch types the values more loosely)
        osd = cast("dict[str, Any]", get_optimizer_state_dict(model, optimizer, options=opts))
        if not self.dist.is_main:
            return None
        for key, source in self.layout.aliases.items():
            msd.setdefault(key, msd[source])
        msd = {k: msd[k] for k in self.layout.keys}
        index = {name: i for i, name in enumerate(self.layout.params)}
        numbered = {
            "state": {index[n]: s for n, s in osd["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]],
        }
        return _StateView(msd, model, self.layout.aliases), _StateView(numbered)

    def from_checkpoint(self, model: nn.Module, path: Any) -> Any:
        """The replicated weights of a checkpoint directory as a module view (rank 0 alone, no
        collective: re-publishing a restored version), or None when the local replica will do."""
        if not self.sharded or path is None:
            return None
        from pathlib import Path

        state = torch.load(Path(path) / "model.pt", map_location="cpu", weights_only=True)
        return _StateView(state, model, self.layout.aliases if self.layout else None)

    def loadable(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        """What CheckpointStore.load_into loads a replicated checkpoint into (collective when sharded)."""
        if not self.sharded:
            return unwrap(model), optimizer
        return _ModelLoader(self, model), _OptimizerLoader(self, model, optimizer)


@contextlib.contextmanager
def aligned_forwards(model: nn.Module, n_local: int) -> Iterator[int]:
    """The number of forward passes every rank must run so that a sharded model's all-gathers match
    (the most any rank needs); yields it. Unsharded or single-process: `n_local`."""
    import torch.distributed as tdist

    if not is_sharded(model) or not tdist.is_initialized() or tdist.get_world_size() == 1:
        yield n_local
        return
    n = torch.tensor([n_local], dtype=torch.int64)
    tdist.all_reduce(n, op=tdist.ReduceOp.MAX)
    yield int(n.item())


# --- memory arithmetic ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU memory of one trainer worker (GB, 1e9 bytes) during the PPO update."""

    params: float  # fp32 master weights (sharded under FSDP)
    grads: float  # fp32 gradients (sharded)
    optimizer: float  # AdamW exp_avg + exp_avg_sq, fp32 (sharded)
    gathered: float  # compute-dtype parameters and gradients of the units being run (FSDP)
    activations: float  # checkpointed layer inputs + one layer recomputed
    logits: float  # response logits (compute dtype), their gradient, one fp32 chunk

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.gathered + self.activations + self.logits


def memory_estimate(
    config: Any,
    *,
    world: int,
    sharded: bool,
    micro_batch_size: int,
    prompt_length: int,
    response_length: int,
    activation_checkpointing: bool,
    compute_bytes: int = 2,
    logits_chunk: int = 4096,
    prefetch_layers: int = 2,
    micro_batch_tokens: int | None = None,
) -> MemoryEstimate:
    """The dominant terms of the update's memory for a Hugging Face decoder `config` (a Llama/Qwen
    layout: attention with grouped KV heads, a gated MLP). A lower bound: the CUDA context, NCCL
    buffers and allocator fragmentation come on top (a few GB). `micro_batch_tokens`
    (`trainer.micro_batch_tokens`, packed): a micro-batch holds at most that many tokens, any of
    them response tokens, instead of `micro_batch_size` padded rows; a single sequence longer than
    the budget runs alone, so the budget is raised to one full sequence."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    vocab = config.vocab_size
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q = config.num_attention_heads * head_dim
    kv = config.num_key_value_heads * head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * inter
    embed = vocab * h
    head = 0 if getattr(config, "tie_word_embeddings", False) else vocab * h
    n_params = layers * per_layer + embed + head
    shard = world if sharded else 1
    gb = 1e9
    params = 4 * n_params / shard / gb
    grads = 4 * n_params / shard / gb
    optimizer = 8 * n_params / shard / gb
    # FSDP: the root unit (embeddings + head) stays gathered through forward and backward, plus
    # `prefetch_layers` decoder layers; each with its unsharded gradient before the reduce-scatter.
    gathered = 2 * compute_bytes * (embed + head + prefetch_layers * per_layer) / gb if sharded else 0.0
    tokens = micro_batch_size * (prompt_length + response_length)
    r_tokens = micro_batch_size * (response_length + 1)
    if micro_batch_tokens is not None:
        tokens = max(micro_batch_tokens, prompt_length + response_length)
        r_tokens = tokens
    if activation_checkpointing:
        kept = layers * tokens * h * compute_bytes
        # one layer recomputed: q/k/v/o and attention output, the MLP's gate, up and product
        one_layer = tokens * (2 * q + 2 * kv + h + 3 * inter) * compute_bytes
        activations = (kept + one_layer) / gb
    else:
        activations = layers * tokens * (2 * q + 2 * kv + 2 * h + 3 * inter) * compute_bytes / gb
    logits = (2 * r_tokens * vocab * compute_bytes + 2 * min(logits_chunk, r_tokens) * vocab * 4) / gb
    return MemoryEstimate(params, grads, optimizer, gathered, activations, logits)


def count_parameters(config: Any) -> int:
    """Parameters of the model `config` describes, counted on the meta device (nothing allocated)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(math.prod(p.shape) for p in model.parameters())


def unwrap(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a DistributedDataParallel wrapper (or the model itself; an
    FSDP2 model is the Hugging Face model, sharded in place)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
