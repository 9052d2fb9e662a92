from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Transaction(_message.Message):
    __slots__ = ("read_version", "uuid", "tag", "transaction_properties", "append", "delete", "overwrite", "create_index", "rewrite", "merge", "restore", "reserve_fragments", "update", "project", "update_config", "data_replacement", "update_mem_wal_state", "clone", "update_bases")
    class TransactionPropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class Append(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Delete(_message.Message):
        __slots__ = ("predicate",)
        PREDICATE_FIELD_NUMBER: _ClassVar[int]
        predicate: str
        def __init__(self, predicate: _Optional[str] = ...) -> None: ...
    class Overwrite(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class CreateIndex(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Rewrite(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Merge(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Project(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Restore(_message.Message):
        __slots__ = ("version",)
        VERSION_FIELD_NUMBER: _ClassVar[int]
        version: int
        def __init__(self, version: _Optional[int] = ...) -> None: ...
    class ReserveFragments(_message.Message):
        __slots__ = ("num_fragments",)
        NUM_FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
        num_fragments: int
        def __init__(self, num_fragments: _Optional[int] = ...) -> None: ...
    class Clone(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Update(_message.Message):
        __slots__ = ("fields_modified",)
        FIELDS_MODIFIED_FIELD_NUMBER: _ClassVar[int]
        fields_modified: _containers.RepeatedScalarFieldContainer[int]
        def __init__(self, fields_modified: _Optional[_Iterable[int]] = ...) -> None: ...
    class UpdateConfig(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class DataReplacement(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class UpdateMemWalState(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class UpdateBases(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    READ_VERSION_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    CREATE_INDEX_FIELD_NUMBER: _ClassVar[int]
    REWRITE_FIELD_NUMBER: _ClassVar[int]
    MERGE_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    RESERVE_FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    DATA_REPLACEMENT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MEM_WAL_STATE_FIELD_NUMBER: _ClassVar[int]
    CLONE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_BASES_FIELD_NUMBER: _ClassVar[int]
    read_version: int
    uuid: str
    tag: str
    transaction_properties: _containers.ScalarMap[str, str]
    append: Transaction.Append
    delete: Transaction.Delete
    overwrite: Transaction.Overwrite
    create_index: Transaction.CreateIndex
    rewrite: Transaction.Rewrite
    merge: Transaction.Merge
    restore: Transaction.Restore
    reserve_fragments: Transaction.ReserveFragments
    update: Transaction.Update
    project: Transaction.Project
    update_config: Transaction.UpdateConfig
    data_replacement: Transaction.DataReplacement
    update_mem_wal_state: Transaction.UpdateMemWalState
    clone: Transaction.Clone
    update_bases: Transaction.UpdateBases
    def __init__(self, read_version: _Optional[int] = ..., uuid: _Optional[str] = ..., tag: _Optional[str] = ..., transaction_properties: _Optional[_Mapping[str, str]] = ..., append: _Optional[_Union[Transaction.Append, _Mapping]] = ..., delete: _Optional[_Union[Transaction.Delete, _Mapping]] = ..., overwrite: _Optional[_Union[Transaction.Overwrite, _Mapping]] = ..., create_index: _Optional[_Union[Transaction.CreateIndex, _Mapping]] = ..., rewrite: _Optional[_Union[Transaction.Rewrite, _Mapping]] = ..., merge: _Optional[_Union[Transaction.Merge, _Mapping]] = ..., restore: _Optional[_Union[Transaction.Restore, _Mapping]] = ..., reserve_fragments: _Optional[_Union[Transaction.ReserveFragments, _Mapping]] = ..., update: _Optional[_Union[Transaction.Update, _Mapping]] = ..., project: _Optional[_Union[Transaction.Project, _Mapping]] = ..., update_config: _Optional[_Union[Transaction.UpdateConfig, _Mapping]] = ..., data_replacement: _Optional[_Union[Transaction.DataReplacement, _Mapping]] = ..., update_mem_wal_state: _Optional[_Union[Transaction.UpdateMemWalState, _Mapping]] = ..., clone: _Optional[_Union[Transaction.Clone, _Mapping]] = ..., update_bases: _Optional[_Union[Transaction.UpdateBases, _Mapping]] = ...) -> None: ...
