"""One reconcile pass of a TrainingRun: apply the desired state, prune what is no longer desired,
observe the children, compute the new status. Idempotent: a second pass over an unchanged run
applies identical manifests (server-side apply makes that a no-op) and returns the same status.

I/O goes through the narrow `Cluster` protocol (kube.py) and a progress callable, so the whole
pass runs in unit tests against an in-memory fake.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Any

from asyncdapo.services.operator.desired import (
    DesiredStateError,
    Lifecycle,
    OperatorDefaults,
    RunRef,
    desired_state,
    object_key,
)
from asyncdapo.services.operator.kube import CHILD_KINDS, Cluster, ImmutableFieldError, owned_by, run_selector
from asyncdapo.services.operator.objects import REDIS_AUTH_KEY, meta, redis_auth_secret_name
from asyncdapo.services.operator.resource_status import TrainingRunStatus, parse_status
from asyncdapo.services.operator.spec import TrainingRunSpec, parse_spec
from asyncdapo.services.operator.status_machine import (
    JobState,
    Observation,
    Progress,
    Readiness,
    lifecycle,
    next_status,
)

log = logging.getLogger(__name__)

ProgressReader = Callable[[str, str], Progress]


def token_secret(ref: RunRef) -> dict[str, Any]:
    """The bearer token of the gateways' control RPCs; created once, never rotated under a run."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": meta(ref, f"{ref.name}-token", "token"),
        "stringData": {"token": secrets.token_urlsafe(32)},
    }


def redis_auth_secret(
    spec: TrainingRunSpec, ref: RunRef, defaults: OperatorDefaults
) -> dict[str, Any] | None:
    """The run's `{run}-redis-auth` Secret, when the operator provides the password: a random one
    for a managed Redis, a copy of the default Redis' one (pods read Secrets of their own namespace
    only). Created once, never read back (the operator has no `get` on Secrets): rotating the
    default Redis' password means deleting these Secrets (`kubectl delete secret -l
    app.kubernetes.io/component=redis-auth -A`) and restarting the runs."""
    if spec.redis.password_secret_ref is not None or spec.redis.url is not None:
        return None
    if spec.redis.managed is not None:
        password = secrets.token_urlsafe(32)
    elif defaults.redis_password:
        password = defaults.redis_password
    else:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": meta(ref, redis_auth_secret_name(ref), "redis-auth"),
        "stringData": {REDIS_AUTH_KEY: password},
    }


def _job_state(obj: dict[str, Any] | None) -> JobState | None:
    if obj is None:
        return None
    st = obj.get("status") or {}
    if obj["kind"] == "RayJob":
        return ray_job_state(st)
    suspended = False
    for cond in st.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return JobState(succeeded=True)
        if cond.get("type") == "Failed":
            return JobState(
                failed=True, reason=cond.get("reason") or "JobFailed", message=cond.get("message", "")
            )
        if cond.get("type") == "Suspended":
            suspended = True
    return JobState(active=int(st.get("active") or 0), suspended=suspended)


# KubeRay's jobDeploymentStatus values that end a RayJob (IsJobDeploymentTerminal, plus a spec the
# KubeRay operator refused). `Retrying` is not one: with backoffLimit the failed attempt's cluster
# is deleted and a new one submits the job again, so `jobStatus` reads FAILED in between.
_RAY_DONE = {"Complete", "Failed", "ValidationFailed"}


def ray_job_state(st: dict[str, Any]) -> JobState:
    """A RayJob's status (ray.io/v1) as a JobState."""
    deploy, job = st.get("jobDeploymentStatus", ""), st.get("jobStatus", "")
    failed_attempts = int(st.get("failed") or 0)
    if deploy in _RAY_DONE:
        if deploy == "Complete" and job == "SUCCEEDED":
            return JobState(succeeded=True)
        reason = st.get("reason") or (
            "RayJobValidationFailed" if deploy == "ValidationFailed" else "RayJobFailed"
        )
        return JobState(
            failed=True,
            reason=reason,
            message=st.get("message") or f"RayJob {deploy} (job {job or 'unknown'})",
        )
    if deploy == "Retrying":
        return JobState(
            message=f"RayJob retrying after {failed_attempts} failed attempt(s): {st.get('message', '')}".rstrip(
                ": "
            )
        )
    if deploy in ("Suspended", "Suspending"):
        return JobState(suspended=True)
    return JobState(active=1 if deploy == "Running" else 0)


def _readiness(obj: dict[str, Any] | None, at_least_one: bool = False) -> Readiness | None:
    if obj is None:
        return None
    desired = (obj.get("spec") or {}).get("replicas", 1)
    ready = int((obj.get("status") or {}).get("readyReplicas") or 0)
    return Readiness(ready=ready, desired=min(desired, 1) if at_least_one else desired)


def observe(
    cluster: Cluster, spec: TrainingRunSpec, ref: RunRef, applied: dict[tuple[str, str, str], dict[str, Any]]
) -> dict[str, Any]:
    """Children states keyed like Observation's fields (objects not applied are None)."""

    def child(kind: str, component: str) -> dict[str, Any] | None:
        for (api, k, name), _obj in applied.items():
            if k == kind and name == f"{ref.name}-{component}":
                return cluster.get(api, k, ref.namespace, name)
        return None

    def gateways() -> Readiness | None:
        """Every gateway StatefulSet of the run (one per pool with `gateway.pools`), summed."""
        sets = [
            cluster.get(api, k, ref.namespace, name)
            for (api, k, name) in applied
            if k == "StatefulSet"
            and (name == f"{ref.name}-gateway" or name.startswith(f"{ref.name}-gateway-"))
        ]
        states = [r for r in (_readiness(o) for o in sets) if r is not None]
        if not states:
            return None
        return Readiness(ready=sum(r.ready for r in states), desired=sum(r.desired for r in states))

    trainer = child("Job", "trainer") or child("RayJob", "trainer")
    return {
        "prepare": _job_state(child("Job", "prepare")) if spec.prepare is not None else None,
        "scheduler": _readiness(child("Deployment", "scheduler")),
        "gateways": gateways(),
        "verifier": None
        if spec.verifier.url
        else _readiness(child("Deployment", "verifier"), at_least_one=True),
        "redis": _readiness(child("StatefulSet", "redis")) if spec.redis.managed else None,
        "trainer": _job_state(trainer),
    }


def _apply_all(cluster: Cluster, manifests: list[dict[str, Any]]) -> None:
    for obj in manifests:
        try:
            cluster.apply(obj)
        except ImmutableFieldError as err:
            # A Job's pod template cannot change: replace the Job; the trainer resumes from checkpoint.
            if obj["kind"] not in ("Job", "RayJob"):
                raise
            log.warning("replacing %s: %s", object_key(obj), err)
            api, kind, name = object_key(obj)
            cluster.delete(api, kind, obj["metadata"]["namespace"], name)


def _prune(cluster: Cluster, ref: RunRef, keep: set[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    pruned = []
    for api, kind in CHILD_KINDS:
        if not cluster.serves(api, kind):
            continue
        for obj in cluster.list_labelled(api, kind, ref.namespace, run_selector(ref.name)):
            key = (api, kind, obj["metadata"]["name"])
            if key not in keep and owned_by(obj, ref.uid):
                cluster.delete(api, kind, ref.namespace, key[2])
                pruned.append(key)
    return pruned


def reconcile(
    body: dict[str, Any],
    cluster: Cluster,
    defaults: OperatorDefaults,
    read_progress: ProgressReader,
    now: datetime,
) -> TrainingRunStatus:
    """Drive the run's children towards its spec and return the new status (not yet written)."""
    meta_ = body["metadata"]
    ref = RunRef.of(meta_)
    generation = int(meta_.get("generation") or 0)
    prev = parse_status(body.get("status"))
    try:
        spec = parse_spec(body.get("spec") or {}, ref.name)
    except ValueError as err:  # SpecError: one `spec.field: given; allowed` line per problem
        return next_status(prev, Observation(generation, None, ("InvalidSpec", str(err))), now)

    status = prev
    seen: set[Lifecycle] = set()
    # A transition (Prepared, Succeeded, suspend) changes the shape of the children: re-apply
    # in the same pass so that GPUs are released or rollout starts without waiting a timer tick.
    while (cycle := lifecycle(spec, status)) not in seen:
        seen.add(cycle)
        try:
            manifests = desired_state(spec, ref, defaults, cycle)
        except DesiredStateError as err:
            return next_status(prev, Observation(generation, spec, (err.reason, str(err))), now)
        cluster.create_if_absent(token_secret(ref))
        if (auth := redis_auth_secret(spec, ref, defaults)) is not None:
            cluster.create_if_absent(auth)
        _apply_all(cluster, manifests)
        applied = {object_key(m): m for m in manifests}
        _prune(cluster, ref, set(applied))
        progress = read_progress(ref.name, ref.namespace) if cycle is Lifecycle.RUNNING else Progress()
        obs = Observation(generation, spec, None, progress=progress, **observe(cluster, spec, ref, applied))
        status = next_status(prev, obs, now)
    return status


def status_patch(status: TrainingRunStatus) -> dict[str, Any]:
    """The status as a JSON merge patch body (camelCase, RFC 3339 times)."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)
