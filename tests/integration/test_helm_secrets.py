"""Secrets on the rendered platform: the Helm chart (its generated Redis password Secret, an
existingSecret, an external Redis' Secret, the plain manifests) and the operator's per-run objects
(the committed examples rendered as `asyncdapo operator render` renders them, with the run's
token and Redis password Secrets the operator creates beside them).

What must hold, as tests/e2e/test_local_stack_lifecycle.py checks for the local stack: a password
or token reaches a container only through a Secret — `valueFrom.secretKeyRef` or a mounted Secret
volume with an owner/group-only `defaultMode` (0400 or 0440) — never as a literal in any object but
its own Secret (not in a command, args, env `value`, ConfigMap, RayJob entrypoint, label or
annotation), and no Secret carries it in its metadata."""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import required
import yaml

helm = required.module("helm_python")

from asyncdapo.services.operator import chart  # noqa: E402
from asyncdapo.services.operator.cli import (  # noqa: E402
    EXAMPLE_RENDER_ARGS,
    _defaults,
    _main,
    example_render_argv,
    register,
)
from asyncdapo.services.operator.desired import Lifecycle, RunRef, desired_state  # noqa: E402
from asyncdapo.services.operator.pod_settings import pod_specs  # noqa: E402
from asyncdapo.services.operator.reconcile import redis_auth_secret, token_secret  # noqa: E402
from asyncdapo.services.operator.spec import parse_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "deploy" / "k8s" / "examples").glob("*.yaml"))
RESTRICTIVE = {0o400, 0o440}
# env names that carry a credential: they must come from a Secret (valueFrom.secretKeyRef)
SECRET_ENV_WORDS = ("PASSWORD", "TOKEN", "SECRET")
# a password the default Redis' Secret holds: what the operator reads from its env and copies
DEFAULT_REDIS_PASSWORD = "default-redis-pw-Zq81xv0Lmn3Rr5Tt"


def _name(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def check_secrets_stay_in_secrets(
    docs: list[dict[str, Any]], literals: dict[str, str], secret_names: set[str]
) -> list[tuple[str, str, str]]:
    """Assert the module's rules on `docs`; `literals`: what -> value of each credential they may
    hold; `secret_names`: the Secrets a credential may be read from. Returns the (object, env var,
    Secret) references to a credential, for the caller to check that the expected ones exist."""
    assert all(len(v) >= 16 for v in literals.values()), "a literal that short would match by chance"
    refs = []
    for doc in docs:
        where = _name(doc)
        text = json.dumps(doc)
        meta = json.dumps({k: doc["metadata"].get(k) for k in ("labels", "annotations")})
        for what, value in literals.items():
            # a Secret's data holds it; anything else holding it leaks it (args, env values,
            # ConfigMaps, entrypoints, labels, annotations)
            if doc["kind"] != "Secret":
                assert value not in text, f"{what} as a literal in {where}"
            assert value not in meta, f"{what} in the labels or annotations of {where}"
            b64 = base64.b64encode(value.encode()).decode()
            if doc["kind"] != "Secret":
                assert b64 not in text, f"{what} (base64) in {where}"
        for pod in pod_specs(doc):
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for v in volumes.values():
                if "secret" in v:
                    assert v["secret"].get("defaultMode") in RESTRICTIVE, (
                        f"{where}: Secret volume {v['name']} mode {oct(v['secret'].get('defaultMode', 0o644))}"
                    )
                    assert v["secret"]["secretName"] in secret_names, (
                        f"{where}: Secret {v['secret']['secretName']}"
                    )
                sources = (v.get("projected") or {}).get("sources", [])
                if any("secret" in s or "serviceAccountToken" in s for s in sources):
                    assert v["projected"].get("defaultMode") in RESTRICTIVE, f"{where}: projected {v['name']}"
            for c in pod["containers"] + pod.get("initContainers", []):
                for mount in c.get("volumeMounts", []):
                    vol = volumes.get(mount["name"], {})
                    if "secret" in vol or "projected" in vol:
                        assert mount.get("readOnly") is True, f"{where}/{c['name']}: {mount['name']} writable"
                for e in c.get("env", []):
                    if any(w in e["name"].upper() for w in SECRET_ENV_WORDS):
                        assert "value" not in e, f"{where}/{c['name']}: {e['name']} has a literal value"
                        ref = e.get("valueFrom", {}).get("secretKeyRef")
                        assert ref is not None, f"{where}/{c['name']}: {e['name']} not from a Secret: {e}"
                        refs.append((where, e["name"], ref["name"]))
                for e in c.get("envFrom", []):
                    assert "configMapRef" not in e or not any(
                        w in json.dumps(e).upper() for w in SECRET_ENV_WORDS
                    ), f"{where}/{c['name']}: credentials from a ConfigMap"
    return refs


# ------------------------------------------------------------------------------------ the chart
def _chart_password(docs: list[dict[str, Any]], key: str = "password") -> str:
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "asyncdapo-redis-auth"]
    return base64.b64decode(secret["data"][key]).decode()


def _redis_volume(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "asyncdapo-redis"]
    return next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "redis-password")


def test_the_chart_generated_redis_password_stays_in_its_secret() -> None:
    docs = chart.render()
    password = _chart_password(docs)
    assert len(password) >= 40
    refs = check_secrets_stay_in_secrets(docs, {"the Redis password": password}, {"asyncdapo-redis-auth"})
    # the operator reads it from the Secret (to copy it into runs' namespaces); Redis from the file
    assert (
        "Deployment/asyncdapo-operator",
        "ASYNCDAPO_OPERATOR_REDIS_PASSWORD",
        "asyncdapo-redis-auth",
    ) in refs
    assert _redis_volume(docs)["secret"]["secretName"] == "asyncdapo-redis-auth"


@pytest.mark.parametrize(
    ("values", "secret", "key"),
    [
        ({"redis": {"auth": {"existingSecret": "team-redis", "existingSecretKey": "pw"}}}, "team-redis", "pw"),
        (chart.PLAIN_VALUES, "asyncdapo-redis-auth", "password"),  # deploy/k8s/asyncdapo.yaml's values
        (
            {"redis": {"enabled": False, "external": {"url": "redis://r.data.svc:6379/0",
                                                      "passwordSecret": {"name": "ext-redis", "key": "pass"}}}},
            "ext-redis",
            "pass",
        ),
    ],
)  # fmt: skip
def test_an_existing_redis_password_secret_is_only_referenced(
    values: dict[str, Any], secret: str, key: str
) -> None:
    docs = chart.render(values)
    # the chart never holds the password: it renders no Secret for it, every consumer names the Secret
    assert not [d for d in docs if d["kind"] == "Secret"], "the chart rendered a Secret over the user's"
    refs = check_secrets_stay_in_secrets(docs, {}, {secret})
    assert refs == [("Deployment/asyncdapo-operator", "ASYNCDAPO_OPERATOR_REDIS_PASSWORD", secret)]
    (operator,) = [d for d in docs if _name(d) == "Deployment/asyncdapo-operator"]
    (env,) = [e for c in operator["spec"]["template"]["spec"]["containers"] for e in c["env"]
              if e["name"] == "ASYNCDAPO_OPERATOR_REDIS_PASSWORD"]  # fmt: skip
    assert env["valueFrom"]["secretKeyRef"] == {"name": secret, "key": key}
    if values["redis"].get("enabled", True):
        assert _redis_volume(docs)["secret"]["secretName"] == secret
        assert _redis_volume(docs)["secret"]["items"] == [{"key": key, "path": "password"}]


# ------------------------------------------------------------------------- the operator's objects
def _operator_defaults(redis_password: str | None) -> Any:
    """OperatorDefaults as the committed renderings use them (EXAMPLE_RENDER_ARGS: the chart's
    defaults), with the default Redis' password the chart's Secret would give the operator."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(example_render_argv(str(EXAMPLES[0])))
    return _defaults(args, args.kuberay, redis_password)


def _run_objects(tr: dict[str, Any], defaults: Any) -> tuple[list[dict[str, Any]], dict[str, str], set[str]]:
    """What the operator creates for a TrainingRun: its token Secret, its Redis password Secret
    (when the operator provides one) and its workloads in every lifecycle; the credentials'
    literals and the Secrets that may hold them."""
    spec = parse_spec(tr["spec"], tr["metadata"]["name"])
    ref = RunRef(tr["metadata"]["name"], "ml", "00000000-0000-0000-0000-000000000001")
    token = token_secret(ref)
    literals = {"the run's token": token["stringData"]["token"]}
    names = {token["metadata"]["name"]}
    docs = [token]
    if (auth := redis_auth_secret(spec, ref, defaults)) is not None:
        literals["the run's Redis password"] = auth["stringData"]["password"]
        names.add(auth["metadata"]["name"])
        docs.append(auth)
    if spec.redis.password_secret_ref is not None:
        names.add(spec.redis.password_secret_ref.name)
    for lifecycle in (Lifecycle.PREPARING, Lifecycle.RUNNING) if spec.prepare else (Lifecycle.RUNNING,):
        docs += desired_state(spec, ref, defaults, lifecycle)
    return docs, literals, names


def _variants() -> Iterator[tuple[str, dict[str, Any]]]:
    """Each committed example (a managed Redis), and the first on every other kind of Redis."""
    for path in EXAMPLES:
        yield path.stem, yaml.safe_load(path.read_text())
    base = yaml.safe_load(EXAMPLES[0].read_text())
    for label, redis in (
        ("default-redis", None),  # the chart's Redis: its password copied into {run}-redis-auth
        ("url-with-secret", {"url": "redis://r.data.svc:6379/0", "passwordSecretRef": {"name": "team-redis", "key": "pw"}}),
        ("managed-with-secret", {"managed": {"size": "1Gi"}, "passwordSecretRef": {"name": "team-redis", "key": "pw"}}),
    ):  # fmt: skip
        tr = json.loads(json.dumps(base))
        tr["spec"].pop("redis", None)
        if redis is not None:
            tr["spec"]["redis"] = redis
        yield f"{EXAMPLES[0].stem}+{label}", tr


@pytest.mark.parametrize(("label", "tr"), list(_variants()), ids=[v[0] for v in _variants()])
def test_a_runs_token_and_redis_password_stay_in_their_secrets(label: str, tr: dict[str, Any]) -> None:
    defaults = _operator_defaults(DEFAULT_REDIS_PASSWORD)
    docs, literals, names = _run_objects(tr, defaults)
    if "redis" not in tr["spec"]:
        assert literals["the run's Redis password"] == DEFAULT_REDIS_PASSWORD
    literals.setdefault("the default Redis' password", DEFAULT_REDIS_PASSWORD)
    refs = check_secrets_stay_in_secrets(docs, literals, names)
    # every Redis client of the run reads the password from the run's Secret, and only from it
    redis_refs = {secret for _, env, secret in refs if env == "ASYNCDAPO_REDIS_PASSWORD"}
    assert redis_refs and redis_refs <= names, (redis_refs, names)
    # the gateways and the scheduler get the token as a mounted file
    token_vols = [
        v for d in docs for pod in pod_specs(d) for v in pod.get("volumes", [])
        if v.get("secret", {}).get("secretName") == f"{tr['metadata']['name']}-token"
    ]  # fmt: skip
    assert token_vols, "no pod mounts the run's token"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_operator_render_names_the_secrets_and_never_holds_a_value(example: Path) -> None:
    """`asyncdapo operator render` (the committed renderings' command) with the default Redis'
    password set: what it prints names the Secrets and holds no Secret at all."""
    assert "--default-redis-auth" in EXAMPLE_RENDER_ARGS
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert _main(example_render_argv(str(example))) == 0
    docs = [d for d in yaml.safe_load_all(out.getvalue()) if d]
    assert docs and not [d for d in docs if d["kind"] == "Secret"]
    assert "(set)" not in out.getvalue()  # the render's stand-in for the password it never sees
    run = docs[0]["metadata"]["labels"]["asyncdapo.io/run"]
    check_secrets_stay_in_secrets(docs, {}, {f"{run}-token", f"{run}-redis-auth"})


# ------------------------------------------------- a Redis URL with a password: refused everywhere
URL_WITH_PASSWORD = "redis://default:url-pw-Kx93mmQ0aa7Lw2Pp@r.data.svc:6379/0"


def test_the_chart_refuses_an_external_redis_url_with_a_password() -> None:
    """It was rendered into the operator's env value (and from there every run's pods) and the NOTES."""
    with pytest.raises(
        helm.HelmRenderError, match=r"redis\.external\.url carries a password.*passwordSecret"
    ):
        chart.render({"redis": {"enabled": False, "external": {"url": URL_WITH_PASSWORD}}})
    # a user name alone is no secret (a Redis ACL user), and stays allowed
    docs = chart.render(
        {"redis": {"enabled": False, "external": {"url": "redis://trainer@r.data.svc:6379/0"}}}
    )
    check_secrets_stay_in_secrets(docs, {}, set())


def test_the_operator_refuses_a_default_redis_url_with_a_password() -> None:
    from asyncdapo.services.operator.pod_settings import PodSettingsError

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["operator", "render", str(EXAMPLES[0]), "--redis-url", URL_WITH_PASSWORD])
    with pytest.raises(PodSettingsError, match=r"carries a password.*ASYNCDAPO_OPERATOR_REDIS_PASSWORD") as e:
        _defaults(args, kuberay=True)
    assert "url-pw-Kx93mmQ0aa7Lw2Pp" not in str(e.value)


def test_a_run_whose_redis_url_carries_a_password_is_refused() -> None:
    """spec.redis.url with a password was rendered into the scheduler's and the trainer's pods."""
    from asyncdapo.services.operator.desired import DesiredStateError

    tr = yaml.safe_load(EXAMPLES[0].read_text())
    tr["spec"]["redis"] = {"url": URL_WITH_PASSWORD}
    spec = parse_spec(tr["spec"], tr["metadata"]["name"])
    ref = RunRef(tr["metadata"]["name"], "ml", "00000000-0000-0000-0000-000000000001")
    with pytest.raises(DesiredStateError, match=r"spec\.redis\.url.*passwordSecretRef") as e:
        desired_state(spec, ref, _operator_defaults(None), Lifecycle.RUNNING)
    assert "url-pw-Kx93mmQ0aa7Lw2Pp" not in str(e.value)
