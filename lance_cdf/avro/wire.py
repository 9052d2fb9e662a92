"""The Confluent wire format: a magic byte 0, a big-endian 4-byte schema id, then the
Avro body. Writing (`header`, `WireWriter`) and reading (`split`, `split_many`) live here."""

from __future__ import annotations

import io
import json
import struct
from typing import TYPE_CHECKING

import fastavro
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

if TYPE_CHECKING:  # (imported where used: Spark's commit process writes transaction
    import numpy as np  # records with WireWriter and has no other use for numpy)

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
