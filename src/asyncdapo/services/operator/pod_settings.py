"""Cluster-wide pod settings the operator gives every run's pods (from the Helm chart's values):
the pod and container securityContext, the default imagePullSecrets, the label selector of the
monitoring namespace, and the default Redis URL. Parsing of their flags, and applying them to a
run's desired state.

The built-in securityContexts (pods.py, UID 10001) stay the default; a cluster that assigns UIDs
itself (OpenShift's restricted SCC) gives contexts without runAsUser / runAsGroup / fsGroup.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from asyncdapo.contracts.errors import AsyncdapoError

DEFAULT_MONITORING_SELECTOR: tuple[tuple[str, str], ...] = (("kubernetes.io/metadata.name", "monitoring"),)

# A label key (optional DNS-subdomain prefix, then a name) and a label value, as the API server checks them.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(
    rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_LABEL_NAME}$"
)
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")


class PodSettingsError(AsyncdapoError):
    """A malformed operator flag (selector, securityContext JSON, pull secrets, Redis URL)."""


def parse_default_redis_url(text: str | None) -> str | None:
    """The default Redis of runs that set no spec.redis (empty: none). Its password comes through
    ASYNCDAPO_OPERATOR_REDIS_PASSWORD (a Secret), never in the URL: the URL is rendered into every
    run's pods, where it would sit in clear."""
    if not text:
        return None
    if urlsplit(text).password is not None:
        raise PodSettingsError(
            "--redis-url / ASYNCDAPO_OPERATOR_REDIS_URL carries a password (redis://USER:PASSWORD@HOST), "
            "which would be rendered into every run's pods in clear; give the URL without it and the "
            "password through ASYNCDAPO_OPERATOR_REDIS_PASSWORD (the chart's redis Secret does)"
        )
    return text


def parse_selector(text: str) -> tuple[tuple[str, str], ...]:
    """`key=value,key2=value2` -> sorted pairs (a matchLabels selector); at least one pair."""
    pairs: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        key, sep, value = item.partition("=")
        if not item or not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise PodSettingsError(
                f"--monitoring-namespace-selector {text!r}: {item!r} is not key=value with a valid label "
                "key and value; give e.g. kubernetes.io/metadata.name=monitoring (comma-separated pairs)"
            )
        pairs[key] = value
    return tuple(sorted(pairs.items()))


def parse_security_context(text: str | None, flag: str) -> dict[str, Any] | None:
    """A securityContext as JSON (the chart passes its values); empty: the built-in default."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise PodSettingsError(
            f"{flag}: not JSON ({err}); give a JSON object, e.g. '{{\"runAsNonRoot\": true}}'"
        ) from None
    if not isinstance(value, dict):
        raise PodSettingsError(
            f"{flag}: {text!r} is not a JSON object; give e.g. '{{\"runAsNonRoot\": true}}'"
        )
    # Helm drops a key set to null; the same here, so a context is never sent with nulls
    return {k: v for k, v in value.items() if v is not None}


def parse_pull_secrets(text: str | None) -> tuple[str, ...]:
    """`a,b` -> ("a", "b"): imagePullSecrets of runs whose spec names none."""
    names = tuple(n.strip() for n in (text or "").split(",") if n.strip())
    bad = [n for n in names if not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", n)]
    if bad:
        raise PodSettingsError(
            f"--pull-secrets: {bad} are not Secret names (lowercase DNS names, comma-separated)"
        )
    return names


def pod_specs(node: Any) -> Iterator[dict[str, Any]]:
    """Every pod spec in an object (a dict with a `containers` list), templates of templates too."""
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield node
        for value in node.values():
            yield from pod_specs(value)
    elif isinstance(node, list):
        for item in node:
            yield from pod_specs(item)


def apply_pod_settings(
    objs: list[dict[str, Any]],
    *,
    pod_security_context: Mapping[str, Any] | None,
    container_security_context: Mapping[str, Any] | None,
    pull_secrets: tuple[str, ...],
) -> None:
    """In place, on plain-JSON copies: the operator's securityContexts replace the built-in ones of
    every pod and container; its pull secrets go to pods whose run names none (spec.images)."""
    for obj in objs:
        for pod in pod_specs(obj):
            if pod_security_context is not None:
                pod["securityContext"] = dict(pod_security_context)
            if container_security_context is not None:
                for c in [*pod["containers"], *pod.get("initContainers", [])]:
                    c["securityContext"] = json.loads(json.dumps(container_security_context))
            if pull_secrets and "imagePullSecrets" not in pod:
                pod["imagePullSecrets"] = [{"name": n} for n in pull_secrets]
