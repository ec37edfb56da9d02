"""RocketMQ naming: validation, the per-group logical topics (R3) and delivery keys (R14).

Names are validated like RocketMQ's ``TopicValidator`` before they go near a
path; a logical name such as ``%RETRY%G`` is only ever a column value.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import TypeGuard

from retry_engine.errors import InvalidNameError

# Times (progress events, re-drive tasks, a lease's heartbeat, a table's row retention cut) dated further
# ahead of a reader's clock than this are taken as no sign of anything: a clock ahead, or another
# writer; one would read "running", "owned" or "expired" until its time.
FUTURE_EVENTS = dt.timedelta(hours=1)
# The first and last milliseconds of the calendar (years 1-9999) after the epoch: a time from outside
# (a table, a state blob) beyond them is no time.
FIRST_MS = -62_135_596_800_000
LAST_MS = 253_402_300_799_999


def is_whole(value: object) -> TypeGuard[int]:
    """Whether ``value`` is a whole number as JSON and Arrow give it: an int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"

# The lake's tables (a folder each; their columns in :mod:`retry_engine.schemas`).
TABLE_NAMES = (
    "consume_results", "messages", "retry", "dlq", "quarantine", "outcomes", "metrics", "progress", "redrive_audit",
    "redrive_tasks",
)
# Tables the engine and its operator tools write: maintained by default, in the engine too.
ENGINE_TABLES = ("retry", "dlq", "quarantine", "outcomes", "metrics", "progress", "redrive_audit", "redrive_tasks")
# Written by others (consumers and producers: this package's clients, or any Delta writer): `maintain`
# covers them, the engine only when asked.
INPUT_TABLES = ("consume_results", "messages")
MAINTAINED_TABLES = (*INPUT_TABLES, *ENGINE_TABLES)
# Tables whose rows expire after ``[maintenance] <name>_retention``, and the time they are judged by
# (also what a consumer's stream judges a file gone past the retention by: the source's skipExpiredBy).
EXPIRING_TABLES: dict[str, str] = {
    "progress": "recorded_at",
    "metrics": "batch_time",
    "outcomes": "decided_at",
    "retry": "delivered_at",
    "messages": "store_timestamp",
}

TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 255
VALID_CHARACTERS = "%|a-zA-Z0-9_-"
# Always used with fullmatch: ``$`` would also match before a final newline ("g\n").
VALID_NAME = re.compile(f"[{VALID_CHARACTERS}]+")

# Set by a re-drive on the message it writes (B5); later retries copy it (R7).
PROP_REDRIVE_COUNT = "REDRIVE_COUNT"

# Set by ``dlq resend`` on the one message it writes: only the consumer instance named by
# RESEND_TO_CONSUMER (``consumer_id@instance_name``) delivers the row whose msg_id is
# RESEND_MSG_ID. Retries copy both (R7) but have new ids, so they go to the whole group.
PROP_RESEND_TO = "RESEND_TO_CONSUMER"
PROP_RESEND_MSG_ID = "RESEND_MSG_ID"


# What counts as a re-drive count: 1-9 ASCII digits. Anything else (a user's own value,
# "+2", " 2", "2\n", non-ASCII digits) reads as 0, in Python and in Spark alike.
REDRIVE_COUNT_DIGITS = "[0-9]{1,9}"
# The Spark (Java regex) form. ``\z`` and not ``$``: Java's ``$`` also matches before a
# final line terminator, so "2\n" would count as 2 in Spark and (with fullmatch) 0 in Python.
REDRIVE_COUNT_PATTERN = f"^{REDRIVE_COUNT_DIGITS}\\z"
_REDRIVE_COUNT = re.compile(REDRIVE_COUNT_DIGITS)


def parse_redrive_count(value: str | None) -> int:
    """A ``REDRIVE_COUNT`` property value as a count (0 unless it is :data:`REDRIVE_COUNT_DIGITS`, whole)."""
    return int(value) if value is not None and _REDRIVE_COUNT.fullmatch(value) else 0


def redrive_count(properties: Mapping[str, str] | None) -> int:
    """How often a message was re-driven, from its properties (see :func:`parse_redrive_count`)."""
    return parse_redrive_count((properties or {}).get(PROP_REDRIVE_COUNT))


def delivery_key(origin_msg_id: str, reconsume_times: int, redrive_count: int = 0) -> str:
    """R14's de-duplication key of one delivery: ``origin:reconsume_times``, plus ``:r<n>`` once re-driven.

    A re-driven dead letter restarts at reconsume times 0 or keeps its count;
    both were delivered before, so without the re-drive count the key would
    repeat one a de-duplicating consumer has already seen, and it would drop
    the message the operator re-drove.
    """
    key = f"{origin_msg_id}:{reconsume_times}"
    return f"{key}:r{redrive_count}" if redrive_count > 0 else key


def name_problem(name: object, *, kind: str, max_length: int) -> str | None:
    """Why ``name`` is not a valid RocketMQ name, or None when it is."""
    if name is None or name == "":
        return f"{kind} name is missing"
    if not isinstance(name, str):
        return f"{kind} name must be a string, got {type(name).__name__}"
    if len(name) > max_length:
        return f"{kind} name {name[:40]!r}... is {len(name)} characters; at most {max_length} allowed"
    if not VALID_NAME.fullmatch(name):
        return f"{kind} name {name!r} has characters outside [{VALID_CHARACTERS}]"
    return None


def validate_group(group: object) -> str:
    """Return ``group`` if valid, else raise :class:`InvalidNameError`."""
    problem = name_problem(group, kind="group", max_length=GROUP_MAX_LENGTH)
    if problem:
        raise InvalidNameError(problem, code="INVALID_GROUP_NAME")
    assert isinstance(group, str)  # narrowed by name_problem; not an input check
    return group


def validate_topic(topic: object) -> str:
    """Return ``topic`` if valid, else raise :class:`InvalidNameError`."""
    problem = name_problem(topic, kind="topic", max_length=TOPIC_MAX_LENGTH)
    if problem:
        raise InvalidNameError(problem, code="INVALID_TOPIC_NAME")
    assert isinstance(topic, str)
    return topic


def retry_topic(group: str) -> str:
    """``%RETRY%G``: the retry topic belongs to the consumer group, not the topic (R3)."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """``%DLQ%G``: where group G's dead letters go (R3, R9)."""
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_GROUP_TOPIC_PREFIX)


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def named_like_a_topic(group: str) -> bool:
    """Whether ``group`` is named like a group's retry or dead-letter topic: its own retry topic
    (``%RETRY%%RETRY%x``) would be no consumer's (the Consumer refuses it, the engine quarantines it)."""
    return is_retry_topic(group) or is_dlq_topic(group)
