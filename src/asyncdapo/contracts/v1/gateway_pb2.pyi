from asyncdapo.contracts.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "prompt", "sampling", "continuation_token_ids", "continuation_logprobs", "continuation_versions")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CONTINUATION_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CONTINUATION_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    CONTINUATION_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt: str
    sampling: _common_pb2.SamplingParams
    continuation_token_ids: _containers.RepeatedScalarFieldContainer[int]
    continuation_logprobs: _containers.RepeatedScalarFieldContainer[float]
    continuation_versions: _containers.RepeatedCompositeFieldContainer[_common_pb2.VersionRun]
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., prompt: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., continuation_token_ids: _Optional[_Iterable[int]] = ..., continuation_logprobs: _Optional[_Iterable[float]] = ..., continuation_versions: _Optional[_Iterable[_Union[_common_pb2.VersionRun, _Mapping]]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "token_ids", "logprobs", "finish_reason", "prompt_length", "version_runs", "prompt_token_ids", "queue_s", "generate_s")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    VERSION_RUNS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    GENERATE_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: _common_pb2.FinishReason
    prompt_length: int
    version_runs: _containers.RepeatedCompositeFieldContainer[_common_pb2.VersionRun]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    queue_s: float
    generate_s: float
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., prompt_length: _Optional[int] = ..., version_runs: _Optional[_Iterable[_Union[_common_pb2.VersionRun, _Mapping]]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., queue_s: _Optional[float] = ..., generate_s: _Optional[float] = ...) -> None: ...

class GenerateStreamRequest(_message.Message):
    __slots__ = ("requests", "abort_ids")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ABORT_IDS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[GenerateRequest]
    abort_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, requests: _Optional[_Iterable[_Union[GenerateRequest, _Mapping]]] = ..., abort_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GenerateError(_message.Message):
    __slots__ = ("request_id", "code", "message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    code: int
    message: str
    def __init__(self, request_id: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("responses", "errors", "aborts")
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    ABORTS_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[GenerateResponse]
    errors: _containers.RepeatedCompositeFieldContainer[GenerateError]
    aborts: _containers.RepeatedCompositeFieldContainer[AbortResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[GenerateResponse, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[GenerateError, _Mapping]]] = ..., aborts: _Optional[_Iterable[_Union[AbortResponse, _Mapping]]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_ids", "all")
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ..., all: _Optional[bool] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("aborted_ids",)
    ABORTED_IDS_FIELD_NUMBER: _ClassVar[int]
    aborted_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, aborted_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ("mode", "wait_timeout_s")
    MODE_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    mode: _common_pb2.PauseMode
    wait_timeout_s: float
    def __init__(self, mode: _Optional[_Union[_common_pb2.PauseMode, str]] = ..., wait_timeout_s: _Optional[float] = ...) -> None: ...

class PauseResponse(_message.Message):
    __slots__ = ("aborted", "in_flight")
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    aborted: int
    in_flight: int
    def __init__(self, aborted: _Optional[int] = ..., in_flight: _Optional[int] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadWeightsRequest(_message.Message):
    __slots__ = ("version", "uri", "sources", "fetch_only")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    FETCH_ONLY_FIELD_NUMBER: _ClassVar[int]
    version: int
    uri: str
    sources: _containers.RepeatedScalarFieldContainer[str]
    fetch_only: bool
    def __init__(self, version: _Optional[int] = ..., uri: _Optional[str] = ..., sources: _Optional[_Iterable[str]] = ..., fetch_only: _Optional[bool] = ...) -> None: ...

class LoadWeightsResponse(_message.Message):
    __slots__ = ("version", "num_tensors", "reload_s", "bytes_received", "fetch_s")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_TENSORS_FIELD_NUMBER: _ClassVar[int]
    RELOAD_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    FETCH_S_FIELD_NUMBER: _ClassVar[int]
    version: int
    num_tensors: int
    reload_s: float
    bytes_received: int
    fetch_s: float
    def __init__(self, version: _Optional[int] = ..., num_tensors: _Optional[int] = ..., reload_s: _Optional[float] = ..., bytes_received: _Optional[int] = ..., fetch_s: _Optional[float] = ...) -> None: ...

class GetLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchLoadRequest(_message.Message):
    __slots__ = ("interval_ms",)
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    def __init__(self, interval_ms: _Optional[int] = ...) -> None: ...

class Load(_message.Message):
    __slots__ = ("gateway_id", "running", "waiting", "kv_cache_usage", "capacity", "weight_version", "draining", "paused", "pool", "engine", "generated_tokens_total", "max_model_len")
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    gateway_id: str
    running: int
    waiting: int
    kv_cache_usage: float
    capacity: int
    weight_version: int
    draining: bool
    paused: bool
    pool: str
    engine: str
    generated_tokens_total: int
    max_model_len: int
    def __init__(self, gateway_id: _Optional[str] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., capacity: _Optional[int] = ..., weight_version: _Optional[int] = ..., draining: _Optional[bool] = ..., paused: _Optional[bool] = ..., pool: _Optional[str] = ..., engine: _Optional[str] = ..., generated_tokens_total: _Optional[int] = ..., max_model_len: _Optional[int] = ...) -> None: ...
