"""`asyncdapo operator run|crd|dashboards|manifests|render`.

- `run`: the kopf operator (in-cluster config, else ~/.kube/config). Defaults for specs that leave
  them out come from flags or ASYNCDAPO_OPERATOR_* env vars (the Helm chart sets the env). With
  `--leader-election` only the replica holding the Lease runs kopf (lease_elector.py).
- `crd`: print the TrainingRun CRD generated from RunConfig (the chart's copy is this output).
- `dashboards`, `manifests`: regenerate deploy/dashboards/*.json and deploy/k8s/asyncdapo.yaml.
- `render FILE`: print the manifests the operator would apply for a TrainingRun file (offline;
  review them or `kubectl apply` without an operator).
- `check`: the chart's `helm test` probes (an HTTP endpoint answers 200; the CRD is Established).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable
from typing import overload


@overload
def _env(name: str, default: str) -> str: ...
@overload
def _env(name: str, default: None = None) -> str | None: ...
def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"ASYNCDAPO_OPERATOR_{name}", default)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("operator", help="the TrainingRun operator (Kubernetes)")
    osub = p.add_subparsers(dest="operator_command", required=True)

    run = osub.add_parser("run", help="run the kopf operator")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("--namespace", action="append", default=None, help="watch this namespace (repeatable)")
    scope.add_argument("--all-namespaces", action="store_true", help="watch every namespace (default)")
    _default_args(run)
    run.add_argument("--health-port", type=int, default=int(_env("HEALTH_PORT", "8080")))
    run.add_argument("--metrics-port", type=int, default=int(_env("METRICS_PORT", "9090")))
    run.add_argument(
        "--leader-election",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="run kopf only while this replica holds a coordination.k8s.io Lease, so several replicas "
        "can run: one leads, the others stand by (the chart turns it on)",
    )
    run.add_argument(
        "--leader-election-namespace",
        default=None,
        help="namespace of the Lease (default: the pod's own namespace, else `default`)",
    )
    run.add_argument(
        "--leader-election-lease-name",
        default="asyncdapo-operator",
        help="name of the Lease (the chart passes the release's `<fullname>-operator`)",
    )
    run.set_defaults(func=_run)

    crd = osub.add_parser("crd", help="print the TrainingRun CustomResourceDefinition (YAML)")
    crd.add_argument("--output", "-o", help="write to this file instead of stdout")
    crd.set_defaults(func=_crd)

    dash = osub.add_parser("dashboards", help="write the Grafana dashboards JSON (deploy/dashboards)")
    dash.add_argument("--out", default="deploy/dashboards")
    dash.set_defaults(func=_dashboards)

    man = osub.add_parser("manifests", help="render the Helm chart into plain manifests (deploy/k8s)")
    man.add_argument("--out", default="deploy/k8s/asyncdapo.yaml")
    man.set_defaults(func=_manifests)

    render = osub.add_parser("render", help="print the manifests for a TrainingRun file (offline)")
    render.add_argument("file", help="a TrainingRun YAML")
    render.add_argument("--namespace", default="default", help="namespace when the file has none")
    render.add_argument(
        "--lifecycle", default="running", choices=["preparing", "running", "suspended", "succeeded", "failed"]
    )
    render.add_argument("--kuberay", action="store_true", help="render a RayJob for trainer.workers > 1")
    render.add_argument(
        "--default-redis-auth",
        action="store_true",
        help="the default Redis has a password (as the chart's): runs on it read {run}-redis-auth",
    )
    _default_args(render)
    render.set_defaults(func=_render)

    ex = osub.add_parser(
        "examples", help="write `render` of every example TrainingRun (deploy/k8s/examples/rendered)"
    )
    ex.add_argument("--examples", default="deploy/k8s/examples")
    ex.set_defaults(func=_examples)

    check = osub.add_parser("check", help="helm test probes: HTTP endpoints answer, the CRD is established")
    check.add_argument("--http", action="append", default=[], metavar="URL", help="expect 200 (repeatable)")
    check.add_argument("--crd-established", action="store_true", help="the TrainingRun CRD is Established")
    check.add_argument("--timeout-s", type=float, default=60.0, help="retry until this deadline")
    check.set_defaults(func=_check)


def _default_args(p: argparse.ArgumentParser) -> None:
    from asyncdapo.services.operator.desired import OperatorDefaults

    d = OperatorDefaults()
    p.add_argument("--control-plane-image", default=_env("CONTROL_PLANE_IMAGE", d.control_plane_image))
    p.add_argument("--cpu-image", default=_env("CPU_IMAGE", d.cpu_image))
    p.add_argument("--gpu-image", default=_env("GPU_IMAGE", d.gpu_image))
    p.add_argument("--redis-image", default=_env("REDIS_IMAGE", d.redis_image))
    p.add_argument("--pull-policy", default=_env("PULL_POLICY", d.pull_policy))
    p.add_argument("--redis-url", default=_env("REDIS_URL"), help="Redis of runs that set no spec.redis")
    p.add_argument(
        "--monitoring-namespace-selector",
        default=_env("MONITORING_NAMESPACE_SELECTOR", "kubernetes.io/metadata.name=monitoring"),
        metavar="KEY=VALUE,...",
        help="labels of the namespaces that may scrape a run's dedicated verifier (NetworkPolicy)",
    )
    p.add_argument(
        "--pod-security-context",
        default=_env("POD_SECURITY_CONTEXT"),
        metavar="JSON",
        help="securityContext of every run pod (default: restricted, UID 10001)",
    )
    p.add_argument(
        "--container-security-context",
        default=_env("CONTAINER_SECURITY_CONTEXT"),
        metavar="JSON",
        help="securityContext of every run container (default: restricted, UID 10001)",
    )
    p.add_argument(
        "--pull-secrets",
        default=_env("PULL_SECRETS"),
        metavar="NAME,...",
        help="imagePullSecrets of runs whose spec.images.pullSecrets is empty",
    )


def _defaults(
    args: argparse.Namespace, kuberay: bool, redis_password: str | None = None
):  # -> OperatorDefaults
    from asyncdapo.services.operator.desired import OperatorDefaults
    from asyncdapo.services.operator.pod_settings import (
        parse_default_redis_url,
        parse_pull_secrets,
        parse_security_context,
        parse_selector,
    )

    return OperatorDefaults(
        control_plane_image=args.control_plane_image,
        cpu_image=args.cpu_image,
        gpu_image=args.gpu_image,
        redis_image=args.redis_image,
        pull_policy=args.pull_policy,
        redis_url=parse_default_redis_url(args.redis_url),
        redis_password=redis_password,
        kuberay=kuberay,
        monitoring_namespace_selector=parse_selector(args.monitoring_namespace_selector),
        pod_security_context=parse_security_context(args.pod_security_context, "--pod-security-context"),
        container_security_context=parse_security_context(
            args.container_security_context, "--container-security-context"
        ),
        pull_secrets=parse_pull_secrets(args.pull_secrets),
    )


def _crd(args: argparse.Namespace) -> int:
    from asyncdapo.services.operator.crd import crd_yaml

    text = crd_yaml()
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _dashboards(args: argparse.Namespace) -> int:
    from asyncdapo.services.operator.dashboards import write_all

    for path in write_all(args.out):
        print(path)
    return 0


def _manifests(args: argparse.Namespace) -> int:
    from pathlib import Path

    from asyncdapo.services.operator.chart import write_plain_manifests

    print(write_plain_manifests(Path(args.out)))
    return 0


def _render(args: argparse.Namespace) -> int:
    import yaml

    from asyncdapo.contracts.config_problems import render
    from asyncdapo.services.operator.desired import DesiredStateError, Lifecycle, RunRef, desired_state
    from asyncdapo.services.operator.spec import SpecError, parse_spec

    with open(args.file) as f:
        docs = [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "TrainingRun"]
    if not docs:
        print(f"{args.file}: no TrainingRun in the file", file=sys.stderr)
        return 1
    out = []
    for doc in docs:
        meta = doc.get("metadata") or {}
        name = meta.get("name", "")
        try:
            spec = parse_spec(doc.get("spec") or {}, name)
            ref = RunRef.of({"uid": "00000000-render", **meta}, args.namespace)
            # the password itself is never rendered: only the Secret that holds it is named
            defaults = _defaults(args, args.kuberay, "(set)" if args.default_redis_auth else None)
            out += desired_state(spec, ref, defaults, Lifecycle(args.lifecycle))
        except SpecError as err:
            print(render(f"{args.file}: TrainingRun {name!r}: invalid spec", err.problems), file=sys.stderr)
            return 1
        except (DesiredStateError, ValueError) as err:
            print(f"{args.file}: TrainingRun {name!r}: {err}", file=sys.stderr)
            return 1
    sys.stdout.write(yaml.safe_dump_all(out, sort_keys=False))
    return 0


# The settings of the committed renderings (golden files): the chart's defaults, namespace `ml`.
EXAMPLE_RENDER_ARGS = [
    "--namespace", "ml",
    "--kuberay",
    "--default-redis-auth",
    "--redis-url", "redis://asyncdapo-redis.asyncdapo.svc:6379/0",
]  # fmt: skip


def example_render_argv(example: str) -> list[str]:
    """`asyncdapo operator render` argv of a committed rendering."""
    return ["operator", "render", example, *EXAMPLE_RENDER_ARGS]


def _main(argv: list[str]) -> int:
    """`asyncdapo operator …` with this module's own parser (a service never imports the console
    script, which imports every service)."""
    parser = argparse.ArgumentParser(prog="asyncdapo")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


def _examples(args: argparse.Namespace) -> int:
    import contextlib
    import io
    from pathlib import Path

    src = Path(args.examples)
    out = src / "rendered"
    out.mkdir(exist_ok=True)
    for example in sorted(src.glob("*.yaml")):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = _main(example_render_argv(str(example)))
        if rc != 0:
            return rc
        header = (
            f"# `asyncdapo {' '.join(example_render_argv(str(example)))}`: what the operator applies for\n"
            f"# {example.name} while it runs. Generated by `make deploy-manifests`; do not edit.\n"
        )
        (out / example.name).write_text(header + buf.getvalue())
        print(out / example.name)
    return 0


def _run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    import kopf
    from kubernetes.config import ConfigException
    from prometheus_client import start_http_server

    from asyncdapo.services.operator import handlers  # noqa: F401  (registers the handlers)
    from asyncdapo.services.operator.kube import KubeCluster
    from asyncdapo.services.operator.service_progress import read_progress

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cluster = KubeCluster()
    except ConfigException as err:
        print(
            f"asyncdapo operator: no Kubernetes API to talk to (in-cluster or ~/.kube/config): {err}",
            file=sys.stderr,
        )
        return 2
    # The default Redis' password (the chart's Secret, through the env): copied into runs' namespaces.
    password = os.environ.get("ASYNCDAPO_OPERATOR_REDIS_PASSWORD") or None
    defaults = _defaults(args, kuberay=cluster.serves("ray.io/v1", "RayJob"), redis_password=password)
    start_http_server(args.metrics_port)
    memo = kopf.Memo(cluster=cluster, defaults=defaults, read_progress=read_progress)

    async def operate() -> None:
        await kopf.operator(
            # only one kopf runs at a time (one replica, or the Lease's leader): no kopf peering,
            # whose equal-priority peers all pause and which needs its own CRDs
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace or (),
            liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz",
            memo=memo,
        )

    if not args.leader_election:
        asyncio.run(operate())
        return 0
    return asyncio.run(_run_elected(args, operate))


# The exit status of a leader that lost its Lease: Kubernetes restarts the container as a standby.
EXIT_LEADERSHIP_LOST = 3
_SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _own_namespace() -> str:
    try:
        with open(_SERVICE_ACCOUNT_NAMESPACE) as f:
            return f.read().strip() or "default"
    except OSError:  # out of cluster (a kubeconfig)
        return "default"


def _exit_on_lost_leadership(transition: object) -> None:
    """The renewal failed or another replica holds the Lease: stop *now*, handlers and all (kopf's
    graceful stop could outlive the Lease), so two leaders never act on the same run."""
    import logging

    logging.getLogger(__name__).critical(
        "lost the operator Lease (%s): exiting with status %d so that Kubernetes restarts this "
        "replica as a standby",
        transition,
        EXIT_LEADERSHIP_LOST,
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_LEADERSHIP_LOST)


async def _run_elected(args: argparse.Namespace, operate: Callable[[], Awaitable[None]]) -> int:
    """Stand by (serving /healthz and /metrics) until this replica holds the Lease, then run kopf
    while renewing it; release it when kopf stops on SIGTERM."""
    import asyncio
    import logging
    import signal

    from asyncdapo.services.operator.leader_election import LeaseRef
    from asyncdapo.services.operator.lease_elector import (
        KubeLeaseApi,
        LeaseElector,
        lead,
        record_transition,
        replica_identity,
        standby_health,
    )

    ref = LeaseRef(args.leader_election_namespace or _own_namespace(), args.leader_election_lease_name)
    elector = LeaseElector(KubeLeaseApi(), ref, replica_identity(), on_transition=record_transition)
    logging.getLogger(__name__).info(
        "leader election: %s waits for Lease %s/%s", elector.identity, ref.namespace, ref.name
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:  # a standby stops cleanly; kopf installs its own handlers once it runs
        loop.add_signal_handler(sig, stop.set)
    try:
        async with standby_health(args.health_port):
            leading = await elector.acquire(stop)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
    if not leading:
        return 0
    if stop.is_set():  # the signal came while the Lease was being taken
        await elector.release()
        return 0
    await lead(elector, operate, _exit_on_lost_leadership)
    return 0


def _check(args: argparse.Namespace) -> int:
    """Retry each probe until it passes or the deadline; print what passed and what did not."""
    import time

    import httpx

    deadline = time.monotonic() + args.timeout_s
    pending: dict[str, object] = {url: None for url in args.http}
    if args.crd_established:
        pending["crd"] = None
    while pending:
        for what in list(pending):
            try:
                if what == "crd":
                    _crd_established()
                else:
                    resp = httpx.get(what, timeout=5.0)
                    if resp.status_code != 200:
                        raise RuntimeError(f"HTTP {resp.status_code}")
            except Exception as err:  # a boundary: report and retry until the deadline
                pending[what] = err
                continue
            print(f"ok: {what}")
            del pending[what]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(2.0)
    for what, error in pending.items():
        print(f"FAILED: {what}: {error}", file=sys.stderr)
    return 1 if pending else 0


def _crd_established() -> None:
    from kubernetes import client, config

    from asyncdapo.services.operator.crd import CRD_NAME

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    crd = client.ApiextensionsV1Api().read_custom_resource_definition(CRD_NAME)
    conds = {c.type: c.status for c in (crd.status.conditions or [])}
    if conds.get("Established") != "True":
        raise RuntimeError(f"{CRD_NAME} is not Established: {conds}")
