"""The publisher's producer loop in C (`_produce.c`), fed whole Arrow columns.

confluent-kafka's `Producer.produce()` costs ~4 us of Python per record with the three
record headers, the largest part of a narrow record's cost on a writer's core.
`ColumnProducer` hands a batch's keys, values, partitions and header values to librdkafka
in one call instead (the same library confluent-kafka ships, loaded by path), so the
per-record work is librdkafka's own.

It is used where it can be: the extension was compiled at install (it is optional: no C
compiler, no extension), the librdkafka that confluent-kafka ships (or the system's) is
found, the producer settings are all plain values (a callback such as `oauth_cb` or
`stats_cb` needs confluent-kafka's Producer), and `LANCE_CDF_NATIVE` is not `0`. Otherwise
the publisher produces through confluent-kafka as before; both send the same records.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pyarrow as pa

try:
    from lance_cdf.kafka import _produce
except ImportError:  # built without a C compiler
    _produce = None

DISABLE_ENV = "LANCE_CDF_NATIVE"


def librdkafka_path() -> str | None:
    """The librdkafka confluent-kafka uses: its wheel's bundled copy, else the system's."""
    import confluent_kafka

    package = os.path.dirname(confluent_kafka.__file__)
    bundled = sorted(glob.glob(package + ".libs/librdkafka*.so*"))
    if bundled:
        return bundled[0]
    for name in ("librdkafka.so.1", "librdkafka.so"):
        try:
            import ctypes

            ctypes.CDLL(name)
            return name
        except OSError:
            continue
    return None


def _setting(value) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    return None  # a callable or an object: only confluent-kafka's Producer takes it


def column_producer(config: dict) -> ColumnProducer | None:
    """A `ColumnProducer` for `config`, or None where the compiled loop cannot be used."""
    if _produce is None or os.environ.get(DISABLE_ENV) == "0":
        return None
    settings = {k: _setting(v) for k, v in config.items()}
    if any(v is None for v in settings.values()):
        return None
    path = librdkafka_path()
    if path is None:
        return None
    _produce.load(path)
    return ColumnProducer(settings)


def _column(array: pa.Array | pa.ChunkedArray) -> tuple:
    """(int32 offsets, data, uint8 validity or None) of a binary array, zero-copy (but for
    joining a chunked array's chunks)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if not pa.types.is_binary(array.type):
        array = array.cast(pa.binary())
    n = len(array)
    if not n:
        return np.zeros(1, np.int32), b"", None
    _, offsets, data = array.buffers()
    offsets = np.frombuffer(offsets, np.int32, n + 1, array.offset * 4)
    valid = None
    if array.null_count:
        valid = np.asarray(array.is_valid()).view(np.uint8)
    return offsets, data if data is not None else b"", valid


class ColumnProducer:
    """A librdkafka producer that takes a batch of records as columns."""

    def __init__(self, settings: dict[str, str]):
        self._producer = _produce.Producer(settings)

    def produce(
        self,
        topic: str,
        partitions: np.ndarray,
        keys: pa.Array,
        values: pa.Array,
        headers: dict[str, pa.Array],
    ) -> None:
        """Enqueue record i = (partitions[i] (-1: the partitioner's), keys[i], values[i]
        (null: a tombstone), headers[name][i] (null: no such header)) for every i, in order.
        Raises RuntimeError if librdkafka refuses a record (those before it are enqueued)."""
        self._producer.produce(
            topic, np.ascontiguousarray(partitions, np.int32), _column(keys), _column(values),
            tuple(headers), tuple(_column(v) for v in headers.values()),
        )  # fmt: skip

    def flush(self, timeout: float) -> int:
        """Wait up to `timeout` s for every record's acknowledgement; the number left."""
        return self._producer.flush(timeout)

    def poll(self, timeout: float) -> int:
        return self._producer.poll(timeout)

    def take_failures(self) -> tuple[int, str]:
        """(delivery failures since the last call, the first one's text)."""
        return self._producer.take_failures()

    def close(self) -> None:
        self._producer.close()
