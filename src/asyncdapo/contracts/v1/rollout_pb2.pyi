from asyncdapo.contracts.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Response(_message.Message):
    __slots__ = ("token_ids", "logprobs", "version_runs", "finish_reason", "reward", "score", "acc", "overlong_penalty", "pred", "gateway")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    VERSION_RUNS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    ACC_FIELD_NUMBER: _ClassVar[int]
    OVERLONG_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRED_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    version_runs: _containers.RepeatedCompositeFieldContainer[_common_pb2.VersionRun]
    finish_reason: _common_pb2.FinishReason
    reward: float
    score: float
    acc: float
    overlong_penalty: float
    pred: str
    gateway: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., version_runs: _Optional[_Iterable[_Union[_common_pb2.VersionRun, _Mapping]]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., reward: _Optional[float] = ..., score: _Optional[float] = ..., acc: _Optional[float] = ..., overlong_penalty: _Optional[float] = ..., pred: _Optional[str] = ..., gateway: _Optional[str] = ...) -> None: ...

class Group(_message.Message):
    __slots__ = ("run", "prompt_id", "prompt_token_ids", "ground_truth", "data_source", "responses", "min_version", "max_version", "reward_mean", "reward_std", "created_unix_ms")
    RUN_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_VERSION_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    REWARD_STD_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    run: str
    prompt_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ground_truth: str
    data_source: str
    responses: _containers.RepeatedCompositeFieldContainer[Response]
    min_version: int
    max_version: int
    reward_mean: float
    reward_std: float
    created_unix_ms: int
    def __init__(self, run: _Optional[str] = ..., prompt_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., ground_truth: _Optional[str] = ..., data_source: _Optional[str] = ..., responses: _Optional[_Iterable[_Union[Response, _Mapping]]] = ..., min_version: _Optional[int] = ..., max_version: _Optional[int] = ..., reward_mean: _Optional[float] = ..., reward_std: _Optional[float] = ..., created_unix_ms: _Optional[int] = ...) -> None: ...
