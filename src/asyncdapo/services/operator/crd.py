"""The `trainingruns.asyncdapo.io` CustomResourceDefinition, generated from the pydantic models.

`spec.run` comes from `run_config_json_schema()` (RunConfig), the workload fields and the status
from `spec.py`; all go through `openapi.to_structural`. The committed copy in the Helm chart
(deploy/helm/asyncdapo/files/trainingruns.crd.yaml, rendered by templates/crds.yaml so that
`helm upgrade` upgrades it) is `asyncdapo operator crd` output; a test keeps it fresh.

Cross-field rules (CEL, `RUN_RULES` / `SPEC_RULES`): the invariants pydantic checks across fields
(RunConfig's, the trainer's start-up checks, the workload's) are CEL rules too, so `kubectl apply`
refuses a spec the operator would mark InvalidSpec. Schema defaults (openapi.py) come from the
pydantic defaults, so `kubectl get -o yaml` shows the effective values and the rules can rely on
every defaulted field being present.

Immutability (CEL transition rules, enforced by the API server): the fields that define what is
being trained and where its state lives cannot change after creation — changing them mid-run
would silently mix two experiments in one set of checkpoints and Redis keys. Each listed leaf gets
`self == oldSelf`; the spec gets a rule that the leaf is neither added nor removed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import yaml

from asyncdapo.contracts.config import RunConfig, run_config_json_schema
from asyncdapo.services.operator.openapi import to_structural
from asyncdapo.services.operator.resource_status import TrainingRunStatus
from asyncdapo.services.operator.spec import API_GROUP, API_VERSION, KIND, PLURAL, TrainingRunSpec

CRD_NAME = f"{PLURAL}.{API_GROUP}"

# Paths under `spec`; the first element of a `run.*` path is RunConfig's snake_case field name.
IMMUTABLE_PATHS: tuple[str, ...] = (
    "run.model",
    "run.data.train_files",
    "run.data.val_files",
    "run.data.prompt_key",
    "run.data.train_batch_size",
    "run.data.max_prompt_length",
    "run.data.max_response_length",
    "run.data.seed",
    "run.rollout.n",
    "run.rollout.mode",
    "run.rollout.max_staleness",
    "run.trainer.workers",
    # which pods mount the workspace, and the access modes of its PVC, follow from it (workspace.py)
    "run.trainer.weight_transport",
    "run.trainer.checkpoint_dir",
    "run.trainer.seed",
    # storage.retain stays mutable: opting in to deletion (or out of it) is allowed at any time
    "storage.claimName",
    "storage.size",
    "storage.storageClassName",
    "storage.accessModes",
    "storage.mountPath",
    "redis",
)


@dataclass(frozen=True)
class CrossFieldRule:
    """A CEL rule the API server checks at admission, mirroring a pydantic validator (`source`),
    so that `kubectl apply` refuses what the operator would. Rules see the object after the API
    server applied the schema defaults, so every defaulted field is present."""

    rule: str
    message: str
    field_path: str
    source: str


# On `spec.run` (RunConfig._cross_field: asyncdapo.contracts.config.impossible_combinations).
RUN_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        "self.data.train_batch_size % self.trainer.ppo_mini_batch_size == 0",
        "spec.run.trainer.ppo_mini_batch_size must divide spec.run.data.train_batch_size",
        ".trainer.ppo_mini_batch_size",
        "RunConfig",
    ),
    CrossFieldRule(
        "!self.reward.overlong_buffer.enable || "
        "self.reward.overlong_buffer.len <= self.data.max_response_length",
        "spec.run.reward.overlong_buffer.len must be <= spec.run.data.max_response_length",
        ".reward.overlong_buffer.len",
        "RunConfig",
    ),
    CrossFieldRule(
        "self.rollout.mode != 'sync' || double(self.rollout.max_staleness) == 0.0",
        "spec.run.rollout.max_staleness must be 0 in rollout.mode sync",
        ".rollout.max_staleness",
        "RunConfig",
    ),
    CrossFieldRule(
        "self.rollout.n > 1 || !self.reward.filter_groups",
        "spec.run.rollout.n must be >= 2 with spec.run.reward.filter_groups (a group of one response has "
        "zero variance: no group would ever be valid)",
        ".rollout.n",
        "RunConfig",
    ),
    CrossFieldRule(
        "self.rollout.mode != 'sync' || self.rollout.max_num_gen_batches == 0 || "
        "self.rollout.max_num_gen_batches * self.rollout.max_concurrent_prompts >= self.data.train_batch_size",
        "spec.run.rollout.max_num_gen_batches x spec.run.rollout.max_concurrent_prompts must reach "
        "spec.run.data.train_batch_size in rollout.mode sync (a step could never gather its valid groups)",
        ".rollout.max_num_gen_batches",
        "RunConfig",
    ),
    CrossFieldRule(
        "self.trainer.publish_every <= 1 || double(self.rollout.max_staleness) >= double(self.trainer.publish_every - 1)",
        "spec.run.trainer.publish_every = k needs spec.run.rollout.max_staleness >= k - 1",
        ".trainer.publish_every",
        "RunConfig",
    ),
    CrossFieldRule(
        "self.trainer.workers <= self.trainer.ppo_mini_batch_size * self.rollout.n",
        "spec.run.trainer.workers must not exceed the responses of a mini-batch "
        "(trainer.ppo_mini_batch_size x rollout.n)",
        ".trainer.workers",
        "RunConfig",
    ),
)

# On `spec` (TrainingRunSpec._workload_rules).
SPEC_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        "!has(self.run.trainer.gpus_per_worker) || self.run.trainer.gpus_per_worker == self.trainer.gpusPerWorker",
        "spec.run.trainer.gpus_per_worker must equal spec.trainer.gpusPerWorker (or be left out)",
        ".run.trainer.gpus_per_worker",
        "TrainingRunSpec",
    ),
)


def _cel(rules: tuple[CrossFieldRule, ...]) -> list[dict[str, Any]]:
    return [
        {"rule": r.rule, "message": r.message, "fieldPath": r.field_path, "reason": "FieldValueInvalid"}
        for r in rules
    ]


# CEL cost estimation needs bounded strings and lists; RunConfig leaves some unbounded.
_CEL_STRING_BOUND = 4096
_CEL_LIST_BOUND = 1024

_DNS_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def spec_schema() -> dict[str, Any]:
    """Structural schema of `spec`, with `spec.run` generated from RunConfig."""
    spec = to_structural(TrainingRunSpec.model_json_schema(mode="validation", by_alias=True))
    run = to_structural(run_config_json_schema())
    run["description"] = spec["properties"]["run"].get("description", run.get("description", ""))
    _fill_defaults(run, RunConfig().model_dump(mode="json"))
    # run.name defaults to metadata.name (spec.parse_spec), not to RunConfig's local default
    run["properties"]["name"].pop("default", None)
    _bound(run)
    run.setdefault("x-kubernetes-validations", []).extend(_cel(RUN_RULES))
    spec["properties"]["run"] = run
    _add_immutability(spec)
    spec.setdefault("x-kubernetes-validations", []).extend(_cel(SPEC_RULES))
    return spec


def _fill_defaults(node: dict[str, Any], value: Any) -> None:
    """Defaults JSON schema cannot carry (pydantic `default_factory` lists) from a default instance."""
    if node.get("type") == "object" and "properties" in node and isinstance(value, dict):
        for key, sub in node["properties"].items():
            if value.get(key) is not None:
                _fill_defaults(sub, value[key])
    elif "default" not in node and value is not None:
        node["default"] = value


def status_schema() -> dict[str, Any]:
    return to_structural(TrainingRunStatus.model_json_schema(mode="validation", by_alias=True))


def _bound(node: dict[str, Any]) -> None:
    if node.get("type") == "string" and "enum" not in node and "format" not in node:
        node.setdefault("maxLength", _CEL_STRING_BOUND)
    if node.get("type") == "array":
        node.setdefault("maxItems", _CEL_LIST_BOUND)
        _bound(node["items"])
    for sub in node.get("properties", {}).values():
        _bound(sub)
    if isinstance(node.get("additionalProperties"), dict):
        _bound(node["additionalProperties"])


def _node_at(spec: dict[str, Any], path: str) -> dict[str, Any]:
    node = spec
    for part in path.split("."):
        try:
            node = node["properties"][part]
        except KeyError:
            raise KeyError(f"immutable path spec.{path}: no field {part!r} in the schema") from None
    return node


def _has_chain(var: str, path: str) -> str:
    parts = path.split(".")
    return " && ".join(f"has({var}.{'.'.join(parts[: i + 1])})" for i in range(len(parts)))


def _add_immutability(spec: dict[str, Any]) -> None:
    required = set(spec.get("required", []))
    presence = []
    for path in IMMUTABLE_PATHS:
        leaf = _node_at(spec, path)
        leaf.setdefault("x-kubernetes-validations", []).append(
            {"rule": "self == oldSelf", "message": f"spec.{path} is immutable"}
        )
        if path in required:
            continue
        presence.append(
            {
                "rule": f"({_has_chain('self', path)}) == ({_has_chain('oldSelf', path)})",
                "message": f"spec.{path} is immutable: it cannot be added or removed",
            }
        )
    spec.setdefault("x-kubernetes-validations", []).extend(presence)


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition as a dict (apiextensions.k8s.io/v1)."""
    root: dict[str, Any] = {
        "type": "object",
        "description": "A DAPO training run: rollout gateways, scheduler, verifier, trainer and state.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        "x-kubernetes-validations": [
            {
                "rule": f"self.metadata.name.size() <= 53 && self.metadata.name.matches('{_DNS_LABEL}')",
                "message": "metadata.name is the run name: a DNS label of at most 53 characters",
            },
            {
                "rule": "!has(self.spec.run.name) || self.spec.run.name == self.metadata.name",
                "message": "spec.run.name must equal metadata.name (or be left out)",
            },
        ],
    }
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
        {"name": "Version", "type": "integer", "jsonPath": ".status.policyVersion"},
        {"name": "Reward", "type": "number", "jsonPath": ".status.reward"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "asyncdapo", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["trun"],
                "categories": ["asyncdapo"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


HEADER = "# Generated by `asyncdapo operator crd` from RunConfig and asyncdapo.services.operator.spec; do not edit.\n"


def crd_yaml() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=100)


def openapi_schema() -> dict[str, Any]:
    """The TrainingRun's openAPIV3Schema (a deep copy), for validating objects in tests and tools."""
    return copy.deepcopy(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
