"""Spark and Python read a ``REDRIVE_COUNT`` property the same way (R14, B5; #12 item 15)."""

from __future__ import annotations

from typing import Any

from retry_engine.clients.dlq import redrive_count_column
from retry_engine.core.names import PROP_REDRIVE_COUNT, parse_redrive_count

# Java's ``$`` matches before any final line terminator (\n, \r\n, \r, \u0085, \u2028).
VALUES = ["3", "007", "3\n", "3\r\n", "3\r", "3\u0085", "3\u2028", "\n3", "3\x00", " 3", "\u0663"]


def test_line_breaks_do_not_make_a_redrive_count_in_spark(spark: Any) -> None:
    """Only whole 1-9 ASCII digit values count (3 and 007); every other value reads 0, as in Python.

    Before #12 item 15, Java's ``$`` let "3\\u2028" through the pattern and the
    ANSI cast then failed the whole Spark job (CAST_INVALID_INPUT): one user
    property could stop a consumer's stream (SPEC bad-input rule).
    """
    df = spark.createDataFrame([({PROP_REDRIVE_COUNT: v},) for v in VALUES], "properties map<string,string>")
    got = [r["n"] for r in df.select(redrive_count_column().alias("n")).collect()]
    expected = [3, 7] + [0] * (len(VALUES) - 2)
    assert got == expected
    assert [parse_redrive_count(v) for v in VALUES] == expected

