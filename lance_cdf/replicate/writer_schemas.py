"""The writer schemas of a topic's records, from the schema registry: fetched once per
schema id (a registry outage waited out, a refusal named), each as the Arrow schema of its
rows, a fastavro reader (`wire.WriterSchemas`) and, where `BatchDecoder` can read it, a
vectorized decoder."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from lance_cdf.avro.decode import AvroDecodeDeclined, BatchDecoder
from lance_cdf.avro.schema import row_arrow_schema
from lance_cdf.avro.wire import WriterSchemas
from lance_cdf.errors import (
    RegistryRefusedError,
    RegistryUnavailableError,
    ReplicateError,
    in_words,
)

if TYPE_CHECKING:
    pass

log = logging.getLogger("lance_cdf.replicate")


class SchemaDecoder:
    """Confluent wire format -> Python dict (one record) or Arrow (many records of one
    schema, vectorized); writer schemas fetched once per schema id."""

    def __init__(self, registry: SchemaRegistryClient, outage_s: float = 120.0):
        self.registry = registry
        self.outage_s = outage_s
        self.outages = 0  # fetches retried because the registry did not answer
        self.writer_schemas = WriterSchemas(self._envelope)
        self.rows: dict[int, pa.Schema] = {}
        self.batch: dict[int, BatchDecoder | None] = {}

    def _schema(self, schema_id: int) -> Schema:
        """The writer schema of an id. An id the registry answers it does not know (a 4xx
        other than 429) is the record's fault: raised as is, and the record stops the
        replicator or goes to the dead-letter topic. An outage (`_registry_outage`: the
        registry unreachable, timing out, failing with a 5xx or 429) is never the
        record's fault: retried with backoff for up to `outage_s` seconds, each retry
        logged, then RegistryUnavailableError, which no dead-letter path takes."""
        deadline = time.monotonic() + self.outage_s
        delay = 0.5
        while True:
            try:
                return self.registry.get_schema(schema_id)
            except Exception as exc:  # noqa: BLE001 - sorted just below
                if _registry_refused(exc):
                    raise RegistryRefusedError(
                        f"the schema registry refused schema id {schema_id} ({str(exc)[:200]})"
                        ": not an answer about the record, so it is not set aside. Check "
                        "--schema-registry (the URL, with its API path) and --registry-config "
                        "(credentials), then start again; nothing of the batch was applied."
                    ) from None
                if not _registry_outage(exc):
                    raise
                why: Exception = exc
            left = deadline - time.monotonic()
            if left <= 0:
                raise RegistryUnavailableError(
                    f"the schema registry did not give schema id {schema_id} for "
                    f"{self.outage_s:.0f} s ({in_words(why)[:200]}). Nothing of "
                    "the batch was applied and no offset moved: start the replicator again "
                    "once the registry answers; no record is lost."
                ) from None
            self.outages += 1
            log.warning(
                "schema registry unavailable (%s); schema id %d asked again in %.1f s "
                "(giving up after %.0f s)",
                in_words(why),
                schema_id,
                min(delay, left),
                self.outage_s,
            )
            time.sleep(min(delay, left))
            delay = min(delay * 2, 10.0)

    def _envelope(self, schema_id: int) -> Any:
        """The writer schema of an id as JSON data (`writer_schemas` parses it), its rows'
        Arrow schema and its vectorized decoder kept beside it."""
        schema_str = self._schema(schema_id).schema_str
        if schema_str is None:
            raise ReplicateError(f"the schema registry has no schema text for id {schema_id}")
        envelope = json.loads(schema_str)
        self.rows[schema_id] = row_arrow_schema(envelope)
        self.batch[schema_id] = _batch_decoder(envelope)
        return envelope

    def decode(self, payload: bytes) -> tuple[int, dict[str, Any]]:
        schema_id, record = self.writer_schemas.read(payload)
        if not isinstance(record, dict):  # an envelope is an Avro record: always a dict
            raise ReplicateError(f"schema id {schema_id} is not a change-event envelope")
        return schema_id, record

    def batch_decoder(self, schema_id: int) -> BatchDecoder | None:
        """The vectorized decoder of a schema id; None when only fastavro reads it."""
        self.writer_schemas.parsed(schema_id)  # (loads the id's schema, and its decoder, once)
        return self.batch[schema_id]


def _registry_refused(exc: Exception) -> bool:
    """Whether a failed schema fetch is a refusal that says nothing of the record (a
    wrong URL or missing credentials: any 4xx but 429 other than "schema not found",
    SR code 40403), which would otherwise send every record to the dead-letter topic."""
    if not isinstance(exc, SchemaRegistryError):
        return False
    status = exc.http_status_code
    return (
        status is not None and 400 <= status < 500 and status != 429 and (exc.error_code != 40403)
    )


def _registry_outage(exc: Exception) -> bool:
    """Whether a failed schema fetch is the registry's outage rather than the record's
    fault: no answer (a transport error or timeout of the client's HTTP library, an
    OSError) or an answer of a 5xx or 429; not an answer that the id is unknown (4xx)."""
    if isinstance(exc, SchemaRegistryError):
        status = exc.http_status_code
        return status is None or status >= 500 or status == 429
    if isinstance(exc, OSError):  # TimeoutError, ConnectionError, ...
        return True
    # httpx's (the client's) TransportError / TimeoutException, without importing it
    return any(c.__name__ in ("TransportError", "TimeoutException") for c in type(exc).__mro__)


def _batch_decoder(envelope: dict[str, Any]) -> BatchDecoder | None:
    """The vectorized decoder of a change-event envelope; None when `BatchDecoder` cannot
    read the schema or it is not an envelope of a row image (then fastavro reads it)."""
    try:
        decoder = BatchDecoder(envelope)
    except (AvroDecodeDeclined, KeyError, TypeError, ValueError):
        return None
    t = decoder.arrow
    names = {t.field(i).name for i in range(t.num_fields)}
    if not {"before", "after", "op", "source"} <= names:
        return None
    source, row = t.field("source").type, t.field("after").type
    if (
        not pa.types.is_struct(source)
        or not {"commit_version", "rowid"}
        <= {source.field(i).name for i in range(source.num_fields)}
        or t.field("op").type != pa.string()
        or not pa.types.is_struct(row)
        or t.field("before").type != row
    ):
        return None
    return decoder
