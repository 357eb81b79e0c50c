"""The operator's view of the Kubernetes API: a small `Cluster` protocol and its real implementation
on the official client's DynamicClient (server-side apply, field manager `asyncdapo-operator`).

Keeping the protocol this narrow is what lets reconcile.py be tested without an API server.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime
from typing import Any, Protocol

from asyncdapo.services.operator.pods import RUN_LABEL
from asyncdapo.services.operator.spec import API_GROUP, API_VERSION, KIND

log = logging.getLogger(__name__)

FIELD_MANAGER = "asyncdapo-operator"

# Every kind the operator creates for a run, in the order children are pruned (dependents first).
# Secrets are not listed: the operator may create them but not read them (RBAC); they go with
# their ownerReference when the run is deleted.
CHILD_KINDS: tuple[tuple[str, str], ...] = (
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("ray.io/v1", "RayJob"),
    ("batch/v1", "Job"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "Deployment"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "PersistentVolumeClaim"),
)


class ImmutableFieldError(RuntimeError):
    """An apply was rejected because it changes an immutable field (e.g. a Job's pod template)."""


class Cluster(Protocol):
    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply; raises ImmutableFieldError on a 422 about immutable fields."""

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        """Delete (background propagation); absent objects are fine."""

    def create_if_absent(self, obj: dict[str, Any]) -> None:
        """Create once, never overwrite (the run's token Secret)."""

    def list_labelled(
        self, api_version: str, kind: str, namespace: str, selector: str
    ) -> list[dict[str, Any]]: ...

    def serves(self, api_version: str, kind: str) -> bool: ...

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch a TrainingRun's status subresource (the periodic pass; kopf handlers patch
        through kopf)."""

    def post_event(self, event: dict[str, Any]) -> None:
        """Create a core/v1 Event (see `event_manifest`)."""


def event_manifest(
    run: dict[str, Any], type_: str, reason: str, message: str, now: datetime, component: str = FIELD_MANAGER
) -> dict[str, Any]:
    """A core/v1 Event about a TrainingRun, as `kubectl describe` shows it."""
    meta = run["metadata"]
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": KIND,
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid", ""),
        },
        "type": type_,
        "reason": reason[:128],
        "message": message[:1024],
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class KubeCluster:
    """`Cluster` on a real API server (in-cluster config, else ~/.kube/config)."""

    def __init__(self) -> None:
        from kubernetes import config, dynamic
        from kubernetes.client import ApiClient

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self._client = dynamic.DynamicClient(ApiClient())

    def _resource(self, api_version: str, kind: str) -> Any:
        return self._client.resources.get(api_version=api_version, kind=kind)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        res = self._resource(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        try:
            out = res.server_side_apply(
                body=obj,
                name=meta["name"],
                namespace=meta.get("namespace"),
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
            )
        except ApiException as err:
            if err.status == 422 and "immutable" in (err.body or ""):
                raise ImmutableFieldError(f"{obj['kind']}/{meta['name']}: {err.body}") from err
            raise
        return out.to_dict()

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.dynamic.exceptions import NotFoundError

        try:
            return self._resource(api_version, kind).get(name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        from kubernetes.dynamic.exceptions import NotFoundError

        with contextlib.suppress(NotFoundError):
            self._resource(api_version, kind).delete(
                name=name, namespace=namespace, body={"propagationPolicy": "Background"}
            )

    def create_if_absent(self, obj: dict[str, Any]) -> None:
        from kubernetes.dynamic.exceptions import ConflictError

        meta = obj["metadata"]
        with contextlib.suppress(ConflictError):  # already there: never rotate a token under running pods
            self._resource(obj["apiVersion"], obj["kind"]).create(body=obj, namespace=meta.get("namespace"))

    def list_labelled(
        self, api_version: str, kind: str, namespace: str, selector: str
    ) -> list[dict[str, Any]]:
        items = self._resource(api_version, kind).get(namespace=namespace, label_selector=selector).to_dict()
        return list(items.get("items", []))

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        from kubernetes.dynamic.exceptions import NotFoundError

        res = self._resource(f"{API_GROUP}/{API_VERSION}", KIND)
        with contextlib.suppress(NotFoundError):  # deleted meanwhile
            res.status.patch(
                name=name,
                namespace=namespace,
                body={"status": status},
                content_type="application/merge-patch+json",
            )

    def post_event(self, event: dict[str, Any]) -> None:
        self._resource("v1", "Event").create(body=event, namespace=event["metadata"]["namespace"])

    def serves(self, api_version: str, kind: str) -> bool:
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        try:
            self._resource(api_version, kind)
        except ResourceNotFoundError:
            return False
        return True


def run_selector(run: str) -> str:
    return f"{RUN_LABEL}={run}"


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(o.get("uid") == uid for o in obj.get("metadata", {}).get("ownerReferences") or [])
