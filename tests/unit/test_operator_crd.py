"""The TrainingRun CRD: generated from RunConfig, structural, fresh in the chart, and its OpenAPI
schema and CEL rules accept the examples and reject what they should (evaluated with a real
OpenAPI 3.0 validator and a real CEL interpreter)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from openapi_schema_validator import OAS30Validator

from asyncdapo.contracts.config import run_config_json_schema
from asyncdapo.services.operator.crd import IMMUTABLE_PATHS, crd, crd_yaml, openapi_schema
from asyncdapo.services.operator.openapi import (
    SchemaConversionError,
    apply_defaults,
    check_structural,
    to_structural,
)

REPO = Path(__file__).resolve().parents[2]
CHART_CRD = REPO / "deploy" / "helm" / "asyncdapo" / "files" / "trainingruns.crd.yaml"  # templates/crds.yaml
EXAMPLES = sorted((REPO / "deploy" / "k8s" / "examples").glob("*.yaml"))


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Reject unknown fields like the API server's strict field validation does."""
    s = copy.deepcopy(schema)

    def walk(node: dict[str, Any]) -> None:
        closed = "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields")
        if node.get("type") == "object" and "properties" in node and closed:
            node["additionalProperties"] = False
        for sub in node.get("properties", {}).values():
            walk(sub)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key])

    walk(s)
    s["properties"]["metadata"] = {"type": "object"}
    return s


VALIDATOR = OAS30Validator(_strict(openapi_schema()))


def schema_errors(obj: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(obj)]


_CEL = celpy.Environment()


def cel_errors(schema: dict[str, Any], new: Any, old: Any = None) -> list[str]:
    """Evaluate every x-kubernetes-validations rule where the object has a value (transition rules,
    those using oldSelf, only where the old object has one too) — as the API server does: on the
    objects after structural defaulting (the stored old object was defaulted too)."""
    new = apply_defaults(schema, new)
    old = None if old is None else apply_defaults(schema, old)
    return _cel_errors(schema, new, old)


def _cel_errors(schema: dict[str, Any], new: Any, old: Any = None) -> list[str]:
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations", []):
        transition = "oldSelf" in rule["rule"]
        if transition and old is None:
            continue
        act = {"self": celpy.json_to_cel(new)}
        if transition:
            act["oldSelf"] = celpy.json_to_cel(old)
        if not bool(_CEL.program(_CEL.compile(rule["rule"])).evaluate(act)):
            errors.append(rule["message"])
    if isinstance(new, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in new:
                o = old.get(key) if isinstance(old, dict) else None
                errors += _cel_errors(sub, new[key], o)
        if isinstance(schema.get("additionalProperties"), dict):
            for key, value in new.items():
                o = old.get(key) if isinstance(old, dict) else None
                errors += _cel_errors(schema["additionalProperties"], value, o)
    if isinstance(new, list) and isinstance(schema.get("items"), dict):
        for item in new:
            errors += _cel_errors(schema["items"], item, None)
    return errors


def _example(name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / "deploy" / "k8s" / "examples" / name).read_text())


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return openapi_schema()


def test_committed_crd_is_fresh() -> None:
    assert CHART_CRD.read_text() == crd_yaml(), "run `make deploy-manifests` (asyncdapo operator crd)"


def test_crd_is_structural_and_spec_run_is_runconfig(schema: dict[str, Any]) -> None:
    check_structural(schema)
    run = schema["properties"]["spec"]["properties"]["run"]
    expected = to_structural(run_config_json_schema())

    def names(node: dict[str, Any], prefix: str = "") -> set[str]:
        out = set()
        for k, v in node.get("properties", {}).items():
            out.add(prefix + k)
            out |= names(v, f"{prefix}{k}.")
        return out

    assert names(run) == names(expected)
    assert run["properties"]["rollout"]["properties"]["mode"]["enum"] == ["async", "sync"]
    tis = run["properties"]["algorithm"]["properties"]["tis_cap"]
    assert tis["nullable"] is True and tis["exclusiveMinimum"] is True and tis["minimum"] == 0
    betas = run["properties"]["trainer"]["properties"]["betas"]
    assert betas["items"] == {"type": "number"} and betas["minItems"] == betas["maxItems"] == 2


def test_crd_shape() -> None:
    c = crd()
    version = c["spec"]["versions"][0]
    assert c["metadata"]["name"] == "trainingruns.asyncdapo.io" and version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    cols = {col["name"]: col["jsonPath"] for col in version["additionalPrinterColumns"]}
    assert cols["Phase"] == ".status.phase" and cols["Step"] == ".status.step"
    assert cols["Version"] == ".status.policyVersion" and cols["Reward"] == ".status.reward"
    assert cols["Age"] == ".metadata.creationTimestamp"
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for field in ("observedGeneration", "phase", "reason", "message", "conditions", "step", "policyVersion",
                  "lastCheckpoint", "startTime", "completionTime"):  # fmt: skip
        assert field in status
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]


def test_converter_rejects_what_kubernetes_cannot_express() -> None:
    with pytest.raises(SchemaConversionError, match=r"\$\.x: a union"):
        to_structural(
            {"type": "object", "properties": {"x": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}}}
        )
    with pytest.raises(SchemaConversionError, match="unsupported JSON-schema keyword 'oneOf'"):
        to_structural({"type": "object", "properties": {"y": {"oneOf": [{"type": "integer"}]}}})
    with pytest.raises(SchemaConversionError, match="no type"):
        check_structural({"type": "object", "properties": {"z": {"description": "untyped"}}})


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_crd(path: Path, schema: dict[str, Any]) -> None:
    obj = yaml.safe_load(path.read_text())
    assert obj["apiVersion"] == "asyncdapo.io/v1alpha1" and obj["kind"] == "TrainingRun"
    assert schema_errors(obj) == []
    assert cel_errors(schema, obj) == []


def test_schema_rejects_wrong_fields(schema: dict[str, Any]) -> None:
    obj = _example("tiny-math-cpu.yaml")
    bad = copy.deepcopy(obj)
    bad["spec"]["run"]["rollout"]["mode"] = "turbo"
    bad["spec"]["run"]["data"]["train_batch_size"] = 0
    bad["spec"]["gateway"]["replicas"] = "two"
    bad["spec"]["run"]["trainer"]["lr_typo"] = 1.0
    bad["spec"]["storage"]["size"] = "lots"
    errors = "\n".join(schema_errors(bad))
    for where in ("spec.run.rollout.mode", "spec.run.data.train_batch_size", "spec.gateway.replicas",
                  "spec.run.trainer", "spec.storage.size"):  # fmt: skip
        assert where in errors
    missing = copy.deepcopy(obj)
    del missing["spec"]["storage"]
    assert any("'storage' is a required property" in e for e in schema_errors(missing))


def test_cel_rules_on_create(schema: dict[str, Any]) -> None:
    obj = _example("tiny-math-cpu.yaml")
    named = copy.deepcopy(obj)
    named["spec"]["run"]["name"] = "other"
    assert "spec.run.name must equal metadata.name (or be left out)" in cel_errors(schema, named)
    long = copy.deepcopy(obj)
    long["metadata"]["name"] = "x" * 54
    assert any("at most 53" in e for e in cel_errors(schema, long))
    both = copy.deepcopy(obj)
    both["spec"]["redis"] = {"url": "redis://r:6379/0", "managed": {"size": "1Gi"}}
    assert "set redis.url or redis.managed" in cel_errors(schema, both)
    neither = copy.deepcopy(obj)
    neither["spec"]["storage"] = {"accessModes": ["ReadWriteMany"]}
    assert any("storage.claimName" in e for e in cel_errors(schema, neither))
    scaling = copy.deepcopy(obj)
    scaling["spec"]["verifier"]["autoscaling"] = {"enabled": True, "minReplicas": 4, "maxReplicas": 2}
    assert any("maxReplicas must be >= minReplicas" in e for e in cel_errors(schema, scaling))


def test_cel_immutability_on_update(schema: dict[str, Any]) -> None:
    old = _example("qwen3-8b-dapo-gpu.yaml")
    mutable = copy.deepcopy(old)
    mutable["spec"]["gateway"]["replicas"] = 16
    mutable["spec"]["suspend"] = True
    mutable["spec"]["run"]["trainer"]["total_steps"] = 800
    mutable["spec"]["run"]["rollout"]["temperature"] = 0.9
    assert cel_errors(schema, mutable, old) == []

    changes = {
        ("run", "model", "path"): "models/other",
        ("run", "data", "train_batch_size"): 256,
        ("run", "rollout", "max_staleness"): 2,
        ("run", "trainer", "workers"): 4,
        ("storage", "claimName"): "elsewhere",
        ("redis", "managed", "size"): "60Gi",
    }
    for path, value in changes.items():
        new = copy.deepcopy(old)
        node = new["spec"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        errors = cel_errors(schema, new, old)
        assert any("is immutable" in e for e in errors), path

    removed = copy.deepcopy(old)
    del removed["spec"]["run"]["data"]["val_files"]
    # removed: the API server defaults it back to [] (schema default), which the rule refuses
    assert any(e.startswith("spec.run.data.val_files is immutable") for e in cel_errors(schema, removed, old))
    removed_sel = copy.deepcopy(old)
    del removed_sel["spec"]["trainer"]["tolerations"]  # not immutable: fine
    assert cel_errors(schema, removed_sel, old) == []
    no_redis = copy.deepcopy(old)
    del no_redis["spec"]["redis"]["managed"]
    assert "spec.redis is immutable" in cel_errors(schema, no_redis, old)
    assert all(p.split(".")[0] in ("run", "storage", "redis") for p in IMMUTABLE_PATHS)


def test_every_cel_rule_compiles(schema: dict[str, Any]) -> None:
    rules = []

    def walk(node: dict[str, Any]) -> None:
        rules.extend(r["rule"] for r in node.get("x-kubernetes-validations", []))
        for sub in node.get("properties", {}).values():
            walk(sub)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key])

    walk(schema)
    assert len(rules) >= len(IMMUTABLE_PATHS) + 5
    for rule in rules:
        _CEL.compile(rule)


# --- cross-field rules as CEL, and schema defaults ------------------------------------

from asyncdapo.contracts.config import RunConfig  # noqa: E402
from asyncdapo.services.operator.crd import RUN_RULES, SPEC_RULES  # noqa: E402
from asyncdapo.services.operator.spec import parse_spec  # noqa: E402


def _operator_accepts(obj: dict[str, Any]) -> bool:
    try:
        parse_spec(obj["spec"], obj["metadata"]["name"])
    except ValueError:  # pydantic.ValidationError is one
        return False
    return True


def _apiserver_accepts(schema: dict[str, Any], obj: dict[str, Any]) -> bool:
    return not schema_errors(obj) and not cel_errors(schema, obj)


VIOLATIONS: dict[str, dict[tuple[str, ...], Any]] = {
    "ppo_mini_batch_size must divide": {("run", "trainer", "ppo_mini_batch_size"): 3},
    "overlong_buffer.len must be <=": {("run", "reward", "overlong_buffer", "len"): 33},
    "max_staleness must be 0 in rollout.mode sync": {
        ("run", "rollout", "mode"): "sync",
        ("run", "rollout", "max_staleness"): 1,
    },
    "publish_every = k needs": {
        ("run", "trainer", "publish_every"): 3,
        ("run", "rollout", "max_staleness"): 1,
    },
    "workers must not exceed": {("run", "trainer", "workers"): 33},
    "rollout.n must be >= 2 with": {("run", "rollout", "n"): 1},
    "must reach spec.run.data.train_batch_size in rollout.mode sync": {
        ("run", "rollout", "mode"): "sync",
        ("run", "rollout", "max_num_gen_batches"): 1,
        ("run", "rollout", "max_concurrent_prompts"): 2,
    },
    "gpus_per_worker must equal": {("run", "trainer", "gpus_per_worker"): 1},
}


def _set(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = obj["spec"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


@pytest.mark.parametrize("message", sorted(VIOLATIONS))
def test_each_cross_field_rule_is_refused_by_both(message: str, schema: dict[str, Any]) -> None:
    obj = _example("tiny-math-cpu.yaml")
    assert _operator_accepts(obj) and _apiserver_accepts(schema, obj)
    for path, value in VIOLATIONS[message].items():
        _set(obj, path, value)
    assert schema_errors(obj) == []  # each field is fine on its own
    errors = cel_errors(schema, obj)
    assert len(errors) == 1 and message in errors[0], errors
    assert not _operator_accepts(obj)


def test_every_cel_cross_field_rule_is_exercised() -> None:
    messages = [r.message for r in RUN_RULES + SPEC_RULES]
    for m in messages:
        assert sum(key in m for key in VIOLATIONS) == 1, m
    assert len(messages) == len(VIOLATIONS)


@pytest.mark.parametrize(
    ("staleness", "mode", "publish_every", "accepted"),
    [(0.1, "async", 1, True), (0.5, "async", 1, True), (1, "async", 2, True), (1.0, "async", 2, True),
     (0.25, "sync", 1, False), (1.5, "async", 3, False), (2.5, "async", 3, True)],
)  # fmt: skip
def test_a_fractional_max_staleness_is_ruled_on_its_exact_value(
    schema: dict[str, Any], staleness: float, mode: str, publish_every: int, accepted: bool
) -> None:
    """verl fully-async's staleness_threshold (0.1 .. 0.5) fits the schema; sync needs 0 and
    publish_every = k needs s >= k - 1 on the exact value, in the API server as in the operator."""
    obj = _example("tiny-math-cpu.yaml")
    _set(obj, ("run", "rollout", "max_staleness"), staleness)
    _set(obj, ("run", "rollout", "mode"), mode)
    _set(obj, ("run", "trainer", "publish_every"), publish_every)
    assert schema_errors(obj) == []
    assert _apiserver_accepts(schema, obj) is accepted, cel_errors(schema, obj)
    assert _operator_accepts(obj) is accepted


def test_cross_field_rules_agree_with_pydantic_on_random_specs(schema: dict[str, Any]) -> None:
    """Random specs over the fields the cross-field rules read (and a few they do not): the API
    server's verdict (OpenAPI schema + CEL after defaulting) equals the operator's (pydantic)."""
    import random

    rng = random.Random(20)
    base = _example("tiny-math-cpu.yaml")
    choices: dict[tuple[str, ...], list[Any]] = {
        ("run", "data", "train_batch_size"): [1, 4, 6, 8, 12, 16, 64],
        ("run", "trainer", "ppo_mini_batch_size"): [1, 2, 3, 4, 8, 16],
        ("run", "data", "max_response_length"): [8, 16, 32, 512],
        ("run", "reward", "overlong_buffer", "len"): [1, 8, 16, 32, 600],
        ("run", "reward", "overlong_buffer", "enable"): [True, False],
        ("run", "rollout", "mode"): ["async", "sync"],
        ("run", "rollout", "max_staleness"): [0, 1, 2, 4, 0.5, 1.5, 2.0],
        ("run", "rollout", "n"): [1, 2, 8],
        ("run", "reward", "filter_groups"): [True, False],
        ("run", "rollout", "max_num_gen_batches"): [0, 1, 4],
        ("run", "rollout", "max_concurrent_prompts"): [2, 16],
        ("run", "trainer", "publish_every"): [1, 2, 3, 5],
        ("run", "trainer", "workers"): [1, 2, 8, 40],
        ("run", "trainer", "gpus_per_worker"): [None, 0, 1],
        ("trainer", "gpusPerWorker"): [0, 1],
        ("run", "rollout", "temperature"): [0.5, 1.0],
    }
    outcomes = {True: 0, False: 0}
    for _ in range(400):
        obj = copy.deepcopy(base)
        for path, values in choices.items():
            if rng.random() < 0.7:
                value = rng.choice(values)
                if value is None:
                    continue
                _set(obj, path, value)
        operator, apiserver = _operator_accepts(obj), _apiserver_accepts(schema, obj)
        assert operator == apiserver, (operator, cel_errors(schema, obj), obj["spec"]["run"])
        outcomes[operator] += 1
    assert min(outcomes.values()) > 30, outcomes  # both verdicts are well represented


def test_schema_defaults_are_runconfigs(schema: dict[str, Any]) -> None:
    minimal = {
        "apiVersion": "asyncdapo.io/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "r1"},
        "spec": {"run": {}, "storage": {"size": "1Gi"}},
    }
    stored = apply_defaults(schema, minimal)
    run = stored["spec"]["run"]
    expected = RunConfig(name="r1").model_dump(mode="json", exclude_none=True)
    expected.pop("name")
    assert "name" not in run  # run.name defaults to metadata.name, not to RunConfig's local default
    assert run == expected  # every RunConfig default is visible in `kubectl get -o yaml`
    assert stored["spec"]["storage"]["retain"] is True and stored["spec"]["gateway"]["replicas"] == 1
    assert _apiserver_accepts(schema, minimal) and _operator_accepts(minimal)
    assert parse_spec(stored["spec"], "r1").run == parse_spec(minimal["spec"], "r1").run


def test_env_value_from_rules(schema: dict[str, Any]) -> None:
    obj = _example("tiny-math-cpu.yaml")
    obj["spec"]["env"] = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
    assert _apiserver_accepts(schema, obj) and _operator_accepts(obj)
    both = copy.deepcopy(obj)
    both["spec"]["env"][0]["value"] = "plain"
    assert "env: set value or valueFrom" in cel_errors(schema, both) and not _operator_accepts(both)
    two = copy.deepcopy(obj)
    two["spec"]["env"][0]["valueFrom"]["configMapKeyRef"] = {"name": "c", "key": "k"}
    assert any("exactly one of" in e for e in cel_errors(schema, two)) and not _operator_accepts(two)


def test_storage_retain_stays_mutable(schema: dict[str, Any]) -> None:
    old = _example("tiny-math-cpu.yaml")
    new = copy.deepcopy(old)
    new["spec"]["storage"]["retain"] = False
    assert cel_errors(schema, new, old) == []
    grown = copy.deepcopy(old)
    grown["spec"]["storage"]["size"] = "4Gi"
    assert "spec.storage.size is immutable" in cel_errors(schema, grown, old)
