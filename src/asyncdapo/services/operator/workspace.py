"""Which pods of a run mount the workspace volume, and the access modes of a PVC the operator
creates for it. Pure decisions on the spec.

With `run.trainer.weight_transport: stream` (the default) weights reach the gateways from the
trainer's WeightStore over gRPC: a gateway starts from the trainer's weights (`gateway
--weights-from`) and the scheduler takes the tokenizer from the same place (`scheduler
--tokenizer-from`). Neither reads the workspace then; the prompts reach the scheduler through
Redis (the trainer feeds them), so the dataset is the trainer's alone. The scheduler writes its
response log there, so with `scheduler.responseLog` it mounts the workspace again.
"""

from __future__ import annotations

from asyncdapo.contracts.config import WeightTransport
from asyncdapo.services.operator.spec import AccessMode, TrainingRunSpec


def streams_weights(spec: TrainingRunSpec) -> bool:
    """The trainer serves its weights from memory and gateways pull them (no shared volume)."""
    return spec.run.trainer.weight_transport is WeightTransport.STREAM


def gateways_mount_workspace(spec: TrainingRunSpec) -> bool:
    """snapshot: gateways start from model.path and load each version from checkpoint_dir/weights."""
    return not streams_weights(spec)


def scheduler_mounts_workspace(spec: TrainingRunSpec) -> bool:
    """snapshot: the tokenizer is read from model.path; the response log is written there."""
    return not streams_weights(spec) or spec.scheduler.response_log


def workspace_access_modes(spec: TrainingRunSpec) -> list[AccessMode]:
    """`storage.accessModes`, else ReadWriteOnce when a single trainer pod (after the prepare Job)
    is its only user — stream transport, one trainer worker — and ReadWriteMany otherwise.

    Decided from immutable fields only (the transport and the worker count): a PVC's access modes
    cannot change once it exists. `scheduler.responseLog` may be switched on later, so it does not
    enter; the field's description says what it then needs."""
    if spec.storage.access_modes is not None:
        return list(spec.storage.access_modes)
    if streams_weights(spec) and spec.run.trainer.workers == 1:
        return ["ReadWriteOnce"]
    return ["ReadWriteMany"]
