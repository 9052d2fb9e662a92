"""The Confluent wire format: a magic byte 0, a big-endian 4-byte schema id, then the
Avro body. Writing (`header`, `WireWriter`) and reading (`split`, `split_many`) live here."""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import fastavro
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

if TYPE_CHECKING:  # (imported where used: Spark's commit process writes transaction
    import numpy as np  # records with WireWriter and has no other use for numpy)
    from fastavro.types import Schema as ParsedSchema

    from lance_cdf.avro.schema import AvroRecord, AvroSchema

MAGIC = 0
HEADER = struct.Struct(">bI")
HEADER_SIZE = HEADER.size  # 5


def header(schema_id: int) -> bytes:
    """The 5 bytes before every body written with `schema_id`."""
    return HEADER.pack(MAGIC, schema_id)


def split(payload: bytes) -> tuple[int, bytes]:
    """(schema id, Avro body) of one record; ValueError when it is not in the format."""
    if len(payload) < HEADER_SIZE or payload[0] != MAGIC:
        raise ValueError("not in the Confluent wire format (magic byte 0 + schema id)")
    return struct.unpack(">I", payload[1:HEADER_SIZE])[0], payload[HEADER_SIZE:]


def split_many(
    buf: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised `split` over many records laid out in `buf` (record i is
    buf[start[i]:end[i]]): (schema id, -1 where not in the format), ok mask, body starts
    (a bad record's body is empty)."""
    import numpy as np

    n = start.size
    ok = (end - start) >= HEADER_SIZE
    head = np.where(ok, start, 0)
    ok &= buf[head] == MAGIC
    sid = np.zeros(n, np.int64)
    for i in range(1, HEADER_SIZE):
        sid = (sid << 8) | buf[head + i]
    return np.where(ok, sid, -1), ok, np.where(ok, start + HEADER_SIZE, end)


class WireWriter:
    """Avro in the Confluent wire format (magic 0, big-endian schema id, body).

    The schema is registered once under its subject (TopicNameStrategy), the
    same registration confluent-kafka's AvroSerializer does with
    auto.register.schemas, and records are then written with fastavro directly:
    the per-record work is the Avro encoding alone.
    """

    def __init__(self, registry: SchemaRegistryClient, subject: str, schema: AvroSchema):
        self.registry, self.subject, self.schema = registry, subject, schema
        self.parsed = fastavro.parse_schema(schema)
        self.header: bytes | None = None

    def wire_header(self) -> bytes:
        """Magic byte and schema id (registering the schema the first time)."""
        if self.header is None:
            schema_id = self.registry.register_schema(
                self.subject, Schema(json.dumps(self.schema), "AVRO")
            )
            self.header = header(schema_id)
        return self.header

    def encode(self, record: AvroRecord) -> bytes:
        buf = io.BytesIO()
        buf.write(self.wire_header())
        fastavro.schemaless_writer(buf, self.parsed, record)
        return buf.getvalue()


class WriterSchemas:
    """The writer schemas of records in the wire format, by schema id: each loaded once
    (`load`: the id's schema as JSON data, e.g. from the registry) and parsed for fastavro
    once; `read` decodes a record with its writer schema."""

    def __init__(self, load: Callable[[int], Any]):
        self.load = load
        self._parsed: dict[int, ParsedSchema] = {}

    def parsed(self, schema_id: int) -> ParsedSchema:
        """The parsed schema of `schema_id` (loaded the first time it is asked)."""
        found = self._parsed.get(schema_id)
        if found is None:
            found = self._parsed[schema_id] = fastavro.parse_schema(self.load(schema_id))
        return found

    def read(self, payload: bytes) -> tuple[int, Any]:
        """(schema id, the record fastavro reads) of one record in the wire format;
        ValueError when it is not in the format."""
        schema_id, body = split(payload)
        return schema_id, fastavro.schemaless_reader(io.BytesIO(body), self.parsed(schema_id), None)
