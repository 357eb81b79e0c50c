"""Validating objects against a CustomResourceDefinition as the API server would, without one:
the version's openAPIV3Schema with a real OpenAPI 3.0 validator (unknown fields rejected, as with
strict field validation) and its x-kubernetes-validations rules with a real CEL interpreter
(cel-python). Rules that use Kubernetes' CEL library extensions cel-python lacks are reported as
skipped, never silently passed."""

from __future__ import annotations

import copy
import gzip
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import celpy
import yaml
from openapi_schema_validator import OAS30Validator

CRDS = Path(__file__).resolve().parents[1] / "data" / "crds"


def load_crd(name: str) -> dict[str, Any]:
    path = CRDS / name
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return yaml.load(raw, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def version_schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert v["served"], f"{crd['metadata']['name']} {version} is not served"
    return v["schema"]["openAPIV3Schema"]


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    s = copy.deepcopy(schema)

    def walk(node: dict[str, Any]) -> None:
        closed = "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields")
        if "properties" in node and closed:
            node["additionalProperties"] = False
        for sub in node.get("properties", {}).values():
            walk(sub)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key])
        for key in ("allOf", "anyOf", "oneOf"):
            for sub in node.get(key, []):
                walk(sub)

    walk(s)
    s.setdefault("properties", {})["metadata"] = {"type": "object"}  # ObjectMeta: the API server's
    return s


@dataclass
class CelReport:
    errors: list[str] = field(default_factory=list)
    evaluated: int = 0
    skipped: list[str] = field(default_factory=list)  # rules cel-python cannot compile or run


_ENV = celpy.Environment()


def _cel(schema: dict[str, Any], value: Any, report: CelReport, path: str) -> None:
    for rule in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            continue  # transition rules: creation only here
        try:
            ok = _ENV.program(_ENV.compile(rule["rule"])).evaluate({"self": celpy.json_to_cel(value)})
        except Exception as err:  # an extension function (quantity(), url(), ...) cel-python lacks
            report.skipped.append(f"{path}: {rule['rule']} ({type(err).__name__})")
            continue
        report.evaluated += 1
        if not bool(ok):
            report.errors.append(f"{path}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                _cel(sub, value[key], report, f"{path}.{key}")
        if isinstance(schema.get("additionalProperties"), dict):
            for key, v in value.items():
                _cel(schema["additionalProperties"], v, report, f"{path}.{key}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _cel(schema["items"], item, report, f"{path}[{i}]")


def validate(crd: dict[str, Any], obj: dict[str, Any]) -> tuple[list[str], CelReport]:
    """(OpenAPI errors, CEL report) of `obj` against the CRD version its apiVersion names."""
    group, version = obj["apiVersion"].split("/")
    assert group == crd["spec"]["group"] and obj["kind"] == crd["spec"]["names"]["kind"]
    schema = version_schema(crd, version)
    validator = OAS30Validator(_strict(schema))
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    report = CelReport()
    _cel(schema, obj, report, "$")
    return errors, report
