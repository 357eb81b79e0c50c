"""pydantic JSON schema (draft 2020-12, `$defs`/`$ref`) → Kubernetes structural OpenAPI v3 schema.

Kubernetes accepts only a subset of OpenAPI v3 in a CRD (apiextensions.k8s.io/v1 "structural
schemas"): every node has a `type`; no `$ref`; `anyOf`/`oneOf` only as value constraints, never to
declare a type; `null` is spelled `nullable: true`; `exclusiveMinimum` is a boolean next to
`minimum`; no `additionalProperties: false` (unknown fields are pruned or rejected anyway).

Mapping (anything else raises `SchemaConversionError` naming the JSON path, so a new RunConfig
construct fails loudly in the CRD freshness test instead of producing a schema the API server
rejects):
- `$ref` → the definition inlined, the referring node's own keys (description, default) on top;
- `anyOf [X, {type: null}]` → X with `nullable: true`;
- `anyOf [{type: integer}, {type: string}]` → `x-kubernetes-int-or-string` (resource quantities);
- `prefixItems` of equal item schemas (tuples such as AdamW betas) → `items` + min/maxItems;
- numeric `exclusiveMinimum/Maximum` → `minimum/maximum` + boolean flag; `const` → one-value enum;
- `default` → kept (the API server stores the effective value, visible in `kubectl get -o yaml`;
  a run keeps the defaults it was created with across operator upgrades); `null` defaults are
  dropped (an absent nullable field is the same);
- an object property that is optional, not nullable and has no required fields of its own gets
  `default: {}`, so that the API server fills its nested defaults too (pydantic's
  `default_factory` sub-models, which JSON schema cannot express);
- `title`, `additionalProperties: false` → dropped.
"""

from __future__ import annotations

import copy
from typing import Any

_PASS_THROUGH = {
    "type",
    "description",
    "enum",
    "format",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "multipleOf",
    "required",
    "nullable",
    "default",
}
_DROPPED = {"title", "examples", "$defs", "$schema"}
_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


class SchemaConversionError(ValueError):
    """A JSON-schema construct with no structural OpenAPI equivalent; the message names its path."""


def to_structural(schema: dict[str, Any]) -> dict[str, Any]:
    """Convert a pydantic `model_json_schema()` to a structural OpenAPI v3 schema (a new dict)."""
    out = _convert(schema, schema.get("$defs", {}), "$", frozenset())
    check_structural(out)
    return out


def _convert(node: dict[str, Any], defs: dict[str, Any], path: str, seen: frozenset[str]) -> dict[str, Any]:
    if "$ref" in node:
        ref = node["$ref"]
        name = ref.removeprefix("#/$defs/")
        if name == ref or name not in defs:
            raise SchemaConversionError(f"{path}: unresolvable $ref {ref!r}")
        if name in seen:
            raise SchemaConversionError(f"{path}: recursive $ref {ref!r} cannot be inlined")
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return _convert({**defs[name], **siblings}, defs, path, seen | {name})
    if "anyOf" in node:
        return _convert_any_of(node, defs, path, seen)

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or (key == "default" and value is None):
            continue
        if key.startswith("x-kubernetes-") or key in _PASS_THROUGH:
            out[key] = value
        elif key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "properties":
            out["properties"] = {k: _convert(v, defs, f"{path}.{k}", seen) for k, v in value.items()}
            for k, sub in out["properties"].items():
                if k not in node.get("required", ()) and _defaults_to_empty_object(sub):
                    sub["default"] = {}
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif value is not False:  # closed objects: K8s prunes or rejects unknown fields anyway
                out["additionalProperties"] = _convert(value, defs, f"{path}.*", seen)
        elif key == "items":
            out["items"] = _convert(value, defs, f"{path}[]", seen)
        elif key == "prefixItems":
            items = [_convert(v, defs, f"{path}[{i}]", seen) for i, v in enumerate(value)]
            if any(it != items[0] for it in items):
                raise SchemaConversionError(f"{path}: a tuple of different item types has no CRD equivalent")
            out["items"] = items[0]
            out.setdefault("minItems", len(items))
            out.setdefault("maxItems", len(items))
        elif key == "uniqueItems":
            if value:
                raise SchemaConversionError(f"{path}: uniqueItems is not allowed in a CRD schema")
        else:
            raise SchemaConversionError(f"{path}: unsupported JSON-schema keyword {key!r}")
    return out


def _defaults_to_empty_object(node: dict[str, Any]) -> bool:
    return (
        node.get("type") == "object"
        and "properties" in node
        and "default" not in node
        and not node.get("nullable")
        and not node.get("required")
    )


def _convert_any_of(
    node: dict[str, Any], defs: dict[str, Any], path: str, seen: frozenset[str]
) -> dict[str, Any]:
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    options = node["anyOf"]
    non_null = [o for o in options if o != {"type": "null"}]
    nullable = {"nullable": True} if len(non_null) < len(options) else {}
    if len(non_null) == 1:
        return _convert({**non_null[0], **rest, **nullable}, defs, path, seen)
    types = sorted(str(o.get("type")) for o in non_null)
    if types != ["integer", "string"]:
        raise SchemaConversionError(f"{path}: a union of {types} has no structural CRD equivalent")
    pattern = next((o["pattern"] for o in non_null if "pattern" in o), None)
    out: dict[str, Any] = {"x-kubernetes-int-or-string": True, "anyOf": _INT_OR_STRING, **nullable}
    if pattern:
        out["pattern"] = pattern
    if "description" in rest:
        out["description"] = rest["description"]
    if rest.get("default") is not None:
        out["default"] = rest["default"]
    return out


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """`obj` with the schema's defaults filled in, as the API server's structural defaulting does
    (top-down: an absent property with a `default` gets it, then its own properties are defaulted).
    Returns a new object; used to evaluate CEL rules on what the API server would store."""
    if isinstance(obj, dict):
        out = dict(obj)
        props = schema.get("properties", {})
        for key, sub in props.items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
        for key, value in out.items():
            sub = props.get(key)
            if sub is None and isinstance(schema.get("additionalProperties"), dict):
                sub = schema["additionalProperties"]
            if sub is not None:
                out[key] = apply_defaults(sub, value)
        return out
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], item) for item in obj]
    return obj


def check_structural(schema: dict[str, Any], path: str = "$") -> None:
    """Raise `SchemaConversionError` unless every node declares a type (or is int-or-string)."""
    if not (
        "type" in schema
        or schema.get("x-kubernetes-int-or-string")
        or schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        raise SchemaConversionError(f"{path}: node has no type (not structural)")
    if "anyOf" in schema and not schema.get("x-kubernetes-int-or-string"):
        raise SchemaConversionError(f"{path}: anyOf outside x-kubernetes-int-or-string")
    for key, sub in schema.get("properties", {}).items():
        check_structural(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        check_structural(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        check_structural(schema["additionalProperties"], f"{path}.*")
