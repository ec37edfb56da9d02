"""RocketMQ naming: validation and the per-group logical topics (R3).

Names are validated like RocketMQ's ``TopicValidator`` before they go near a
path; a logical name such as ``%RETRY%G`` is only ever a column value.
"""

from __future__ import annotations

import re

from retry_engine.errors import InvalidNameError

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"

TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 255
VALID_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")
VALID_CHARACTERS = "%|a-zA-Z0-9_-"


def name_problem(name: object, *, kind: str, max_length: int) -> str | None:
    """Why ``name`` is not a valid RocketMQ name, or None when it is."""
    if name is None or name == "":
        return f"{kind} name is missing"
    if not isinstance(name, str):
        return f"{kind} name must be a string, got {type(name).__name__}"
    if len(name) > max_length:
        return f"{kind} name {name[:40]!r}... is {len(name)} characters; at most {max_length} allowed"
    if not VALID_NAME.match(name):
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
