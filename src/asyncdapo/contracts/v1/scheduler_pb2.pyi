from asyncdapo.contracts.v1 import common_pb2 as _common_pb2
from asyncdapo.contracts.v1 import gateway_pb2 as _gateway_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_PHASE_UNSPECIFIED: _ClassVar[RunPhase]
    RUN_PHASE_IDLE: _ClassVar[RunPhase]
    RUN_PHASE_ROLLING: _ClassVar[RunPhase]
    RUN_PHASE_BOUND: _ClassVar[RunPhase]
    RUN_PHASE_STOPPING: _ClassVar[RunPhase]
    RUN_PHASE_STOPPED: _ClassVar[RunPhase]

class GatewayState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GATEWAY_STATE_UNSPECIFIED: _ClassVar[GatewayState]
    GATEWAY_STATE_UP: _ClassVar[GatewayState]
    GATEWAY_STATE_DOWN: _ClassVar[GatewayState]
    GATEWAY_STATE_DRAINING: _ClassVar[GatewayState]
RUN_PHASE_UNSPECIFIED: RunPhase
RUN_PHASE_IDLE: RunPhase
RUN_PHASE_ROLLING: RunPhase
RUN_PHASE_BOUND: RunPhase
RUN_PHASE_STOPPING: RunPhase
RUN_PHASE_STOPPED: RunPhase
GATEWAY_STATE_UNSPECIFIED: GatewayState
GATEWAY_STATE_UP: GatewayState
GATEWAY_STATE_DOWN: GatewayState
GATEWAY_STATE_DRAINING: GatewayState

class StartRunRequest(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: str
    def __init__(self, run: _Optional[str] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: str
    def __init__(self, run: _Optional[str] = ...) -> None: ...

class StopRunRequest(_message.Message):
    __slots__ = ("run", "abort_in_flight")
    RUN_FIELD_NUMBER: _ClassVar[int]
    ABORT_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    run: str
    abort_in_flight: bool
    def __init__(self, run: _Optional[str] = ..., abort_in_flight: _Optional[bool] = ...) -> None: ...

class WatchRunRequest(_message.Message):
    __slots__ = ("run", "interval_ms")
    RUN_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    run: str
    interval_ms: int
    def __init__(self, run: _Optional[str] = ..., interval_ms: _Optional[int] = ...) -> None: ...

class RunStatus(_message.Message):
    __slots__ = ("run", "phase", "policy_version", "valid_groups_produced", "valid_groups_bound", "in_flight_prompts", "queue_depth", "outcomes", "early_stops", "aborted_requests", "aborted_tokens", "completions", "generated_tokens", "mode", "max_staleness", "valid_groups_credited", "redis_available", "scheduler_epoch", "max_staleness_exact")
    class OutcomesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RUN_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    VALID_GROUPS_PRODUCED_FIELD_NUMBER: _ClassVar[int]
    VALID_GROUPS_BOUND_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOPS_FIELD_NUMBER: _ClassVar[int]
    ABORTED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ABORTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    VALID_GROUPS_CREDITED_FIELD_NUMBER: _ClassVar[int]
    REDIS_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_EXACT_FIELD_NUMBER: _ClassVar[int]
    run: str
    phase: RunPhase
    policy_version: int
    valid_groups_produced: int
    valid_groups_bound: int
    in_flight_prompts: int
    queue_depth: int
    outcomes: _containers.ScalarMap[str, int]
    early_stops: int
    aborted_requests: int
    aborted_tokens: int
    completions: int
    generated_tokens: int
    mode: str
    max_staleness: int
    valid_groups_credited: int
    redis_available: bool
    scheduler_epoch: int
    max_staleness_exact: float
    def __init__(self, run: _Optional[str] = ..., phase: _Optional[_Union[RunPhase, str]] = ..., policy_version: _Optional[int] = ..., valid_groups_produced: _Optional[int] = ..., valid_groups_bound: _Optional[int] = ..., in_flight_prompts: _Optional[int] = ..., queue_depth: _Optional[int] = ..., outcomes: _Optional[_Mapping[str, int]] = ..., early_stops: _Optional[int] = ..., aborted_requests: _Optional[int] = ..., aborted_tokens: _Optional[int] = ..., completions: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., mode: _Optional[str] = ..., max_staleness: _Optional[int] = ..., valid_groups_credited: _Optional[int] = ..., redis_available: _Optional[bool] = ..., scheduler_epoch: _Optional[int] = ..., max_staleness_exact: _Optional[float] = ...) -> None: ...

class PublishWeightsRequest(_message.Message):
    __slots__ = ("version", "uri", "mode", "trainer_epoch")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TRAINER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    version: int
    uri: str
    mode: _common_pb2.PauseMode
    trainer_epoch: int
    def __init__(self, version: _Optional[int] = ..., uri: _Optional[str] = ..., mode: _Optional[_Union[_common_pb2.PauseMode, str]] = ..., trainer_epoch: _Optional[int] = ...) -> None: ...

class GatewayResult(_message.Message):
    __slots__ = ("gateway", "ok", "error", "duration_s", "aborted")
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    gateway: str
    ok: bool
    error: str
    duration_s: float
    aborted: int
    def __init__(self, gateway: _Optional[str] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., duration_s: _Optional[float] = ..., aborted: _Optional[int] = ...) -> None: ...

class PublishWeightsResponse(_message.Message):
    __slots__ = ("version", "results", "duration_s")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    version: int
    results: _containers.RepeatedCompositeFieldContainer[GatewayResult]
    duration_s: float
    def __init__(self, version: _Optional[int] = ..., results: _Optional[_Iterable[_Union[GatewayResult, _Mapping]]] = ..., duration_s: _Optional[float] = ...) -> None: ...

class GatewayInfo(_message.Message):
    __slots__ = ("address", "state", "load", "dispatched_in_flight", "last_error")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    address: str
    state: GatewayState
    load: _gateway_pb2.Load
    dispatched_in_flight: int
    last_error: str
    def __init__(self, address: _Optional[str] = ..., state: _Optional[_Union[GatewayState, str]] = ..., load: _Optional[_Union[_gateway_pb2.Load, _Mapping]] = ..., dispatched_in_flight: _Optional[int] = ..., last_error: _Optional[str] = ...) -> None: ...

class ListGatewaysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListGatewaysResponse(_message.Message):
    __slots__ = ("gateways",)
    GATEWAYS_FIELD_NUMBER: _ClassVar[int]
    gateways: _containers.RepeatedCompositeFieldContainer[GatewayInfo]
    def __init__(self, gateways: _Optional[_Iterable[_Union[GatewayInfo, _Mapping]]] = ...) -> None: ...

class DrainGatewayRequest(_message.Message):
    __slots__ = ("address", "abort_in_flight")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ABORT_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    address: str
    abort_in_flight: bool
    def __init__(self, address: _Optional[str] = ..., abort_in_flight: _Optional[bool] = ...) -> None: ...

class DrainGatewayResponse(_message.Message):
    __slots__ = ("gateway",)
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    gateway: GatewayInfo
    def __init__(self, gateway: _Optional[_Union[GatewayInfo, _Mapping]] = ...) -> None: ...

class EvalPrompt(_message.Message):
    __slots__ = ("id", "prompt_token_ids", "prompt", "ground_truth")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt: str
    ground_truth: str
    def __init__(self, id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., prompt: _Optional[str] = ..., ground_truth: _Optional[str] = ...) -> None: ...

class EvaluateRequest(_message.Message):
    __slots__ = ("prompts", "n", "sampling")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[EvalPrompt]
    n: int
    sampling: _common_pb2.SamplingParams
    def __init__(self, prompts: _Optional[_Iterable[_Union[EvalPrompt, _Mapping]]] = ..., n: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class EvalResult(_message.Message):
    __slots__ = ("id", "acc", "score", "response_length", "pred")
    ID_FIELD_NUMBER: _ClassVar[int]
    ACC_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    PRED_FIELD_NUMBER: _ClassVar[int]
    id: str
    acc: _containers.RepeatedScalarFieldContainer[float]
    score: _containers.RepeatedScalarFieldContainer[float]
    response_length: _containers.RepeatedScalarFieldContainer[int]
    pred: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., acc: _Optional[_Iterable[float]] = ..., score: _Optional[_Iterable[float]] = ..., response_length: _Optional[_Iterable[int]] = ..., pred: _Optional[_Iterable[str]] = ...) -> None: ...

class EvaluateResponse(_message.Message):
    __slots__ = ("results", "accuracy", "mean_response_length", "policy_version")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    MEAN_RESPONSE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[EvalResult]
    accuracy: float
    mean_response_length: float
    policy_version: int
    def __init__(self, results: _Optional[_Iterable[_Union[EvalResult, _Mapping]]] = ..., accuracy: _Optional[float] = ..., mean_response_length: _Optional[float] = ..., policy_version: _Optional[int] = ...) -> None: ...
