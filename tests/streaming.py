"""Helpers shared by the streaming tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql.streaming.query import StreamingQuery


@contextmanager
def running(query: StreamingQuery) -> Iterator[StreamingQuery]:
    """Stop ``query`` however the block ends."""
    try:
        yield query
    finally:
        query.stop()
