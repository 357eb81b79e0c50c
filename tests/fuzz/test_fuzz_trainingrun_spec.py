"""The operator's TrainingRun render on generated specs: the examples with fields replaced by junk,
removed, or the spec's sections swapped for other shapes. `parse_spec` answers SpecError naming
each problem (a `spec.`-rooted field path), or a spec whose rendered objects are well formed
Kubernetes objects (or a DesiredStateError, the render's documented refusal); nothing else escapes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml
from fuzz_budget import answered, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from asyncdapo.services.operator.desired import (
    DesiredStateError,
    Lifecycle,
    OperatorDefaults,
    RunRef,
    desired_state,
)
from asyncdapo.services.operator.spec import SpecError, parse_spec

SURFACE = "trainingrun_spec"
EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "examples"
SPECS = [yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES.glob("*.yaml"))]
REF = RunRef(name="tiny-math", namespace="ml", uid="uid-fuzz")
K8S_VERSION = "1.33.0"

JUNK = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["", "0", "-1", "1Gi", "500m", "abc", "http://x", "a" * 300]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def specs(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """(metadata.name, spec): an example with 1-4 edits (a value replaced, a key removed or added)."""
    raw = draw(st.sampled_from(SPECS))
    spec = copy.deepcopy(raw["spec"])
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(spec)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = spec
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(JUNK)
        elif action == "remove":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=10))] = draw(JUNK)
    if draw(st.integers(0, 9)) == 0:
        spec[draw(st.sampled_from([*spec, "run"]))] = draw(JUNK)  # a whole section of another shape
    return raw["metadata"]["name"], spec


def _check_render(name: str, spec: dict[str, Any], lifecycle: Lifecycle, validate: bool) -> None:
    try:
        parsed = parse_spec(spec, name)
    except SpecError as err:
        assert err.problems and all(p.field.startswith("spec.") for p in err.problems), str(err)
        return
    ref = RunRef(name=name, namespace=REF.namespace, uid=REF.uid)
    try:
        objs = desired_state(parsed, ref, OperatorDefaults(kuberay=True), lifecycle)
    except DesiredStateError as err:
        assert str(err)
        return
    yaml.safe_dump_all(objs)  # serialisable as the operator applies them
    for obj in objs:
        assert obj["metadata"]["namespace"] == "ml" and obj["metadata"]["labels"]["asyncdapo.io/run"] == name
        if validate and obj["kind"] != "RayJob":  # a third-party CRD: no official schema
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@fuzz_settings(1.0)
@given(named=specs(), lifecycle=st.sampled_from(list(Lifecycle)), validate=st.integers(0, 19))
def test_spec_renders_or_names_its_problems(
    named: tuple[str, dict[str, Any]], lifecycle: Lifecycle, validate: int
) -> None:
    name, spec = named
    with answered(SURFACE, spec):
        # one input in 20 is also checked against the official Kubernetes schemas (slow: ~objects x 20 ms)
        _check_render(name, spec, lifecycle, validate == 0)
