from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetManifestRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class WeightFile(_message.Message):
    __slots__ = ("name", "size", "first_chunk", "num_chunks")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    FIRST_CHUNK_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    first_chunk: int
    num_chunks: int
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., first_chunk: _Optional[int] = ..., num_chunks: _Optional[int] = ...) -> None: ...

class WeightManifest(_message.Message):
    __slots__ = ("version", "chunk_bytes", "files", "chunk_sha256", "total_bytes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SHA256_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    version: int
    chunk_bytes: int
    files: _containers.RepeatedCompositeFieldContainer[WeightFile]
    chunk_sha256: _containers.RepeatedScalarFieldContainer[bytes]
    total_bytes: int
    def __init__(self, version: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., files: _Optional[_Iterable[_Union[WeightFile, _Mapping]]] = ..., chunk_sha256: _Optional[_Iterable[bytes]] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class ReadChunksRequest(_message.Message):
    __slots__ = ("version", "first", "count")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    version: int
    first: int
    count: int
    def __init__(self, version: _Optional[int] = ..., first: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("index", "data")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    data: bytes
    def __init__(self, index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...
