from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Field(_message.Message):
    __slots__ = ("type", "name", "id", "parent_id", "logical_type", "nullable", "metadata", "extension_name", "unenforced_primary_key")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PARENT: _ClassVar[Field.Type]
        REPEATED: _ClassVar[Field.Type]
        LEAF: _ClassVar[Field.Type]
    PARENT: Field.Type
    REPEATED: Field.Type
    LEAF: Field.Type
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    TYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_TYPE_FIELD_NUMBER: _ClassVar[int]
    NULLABLE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    EXTENSION_NAME_FIELD_NUMBER: _ClassVar[int]
    UNENFORCED_PRIMARY_KEY_FIELD_NUMBER: _ClassVar[int]
    type: Field.Type
    name: str
    id: int
    parent_id: int
    logical_type: str
    nullable: bool
    metadata: _containers.ScalarMap[str, bytes]
    extension_name: str
    unenforced_primary_key: bool
    def __init__(self, type: _Optional[_Union[Field.Type, str]] = ..., name: _Optional[str] = ..., id: _Optional[int] = ..., parent_id: _Optional[int] = ..., logical_type: _Optional[str] = ..., nullable: _Optional[bool] = ..., metadata: _Optional[_Mapping[str, bytes]] = ..., extension_name: _Optional[str] = ..., unenforced_primary_key: _Optional[bool] = ...) -> None: ...
