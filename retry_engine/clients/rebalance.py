"""Sharing a CLUSTERING group's queues among its live instances (RocketMQ rebalance; #12 item 19).

RocketMQ gives each queue of a topic to exactly one live instance of a
clustering group: every client sends heartbeats, every client sorts the
queues and the live client ids the same way, and each takes its own share
(``AllocateMessageQueueAveragely``). Here:

* :func:`allocate_averagely` is that strategy, a pure function;
* :class:`Membership` is the heartbeat registry: one small JSON file per
  instance under ``<lake>/_consumers/group-<hash>/`` (names never become
  paths: both folder and file names are hashes). An instance whose last
  heartbeat is older than the expiry is not live; a graceful close deletes
  its file, so its queues move at the next batch of the others.

Spark-free: the consumer (``consumer.py``) applies an allocation to its rows.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from retry_engine.core.names import is_whole
from retry_engine.delta import storage
from retry_engine.errors import SubscriptionError

log = logging.getLogger(__name__)

# RocketMQ: heartbeats every 30 s, a client is dropped after 120 s without one. The consumer
# here beats more often because a micro-batch, not a 20 s rebalance timer, applies the result.
DEFAULT_HEARTBEAT_INTERVAL_SECONDS = 10.0
DEFAULT_HEARTBEAT_EXPIRY_SECONDS = 30.0
# A heartbeat this much older than its expiry (and at least a day old) is an instance that died
# without leaving (killed, its host lost): ``live`` deletes its file, or every batch of every instance
# would list and read it for good (a GET each on an object store), one more per crash for months.
FORGET_AFTER_EXPIRIES = 100
FORGET_AFTER_MIN_SECONDS = 86_400.0
MEMBER_ID_MAX_LENGTH = 255
# Host names, pids, IPv6 addresses and RocketMQ instance names fit; whitespace, line breaks,
# path separators and anything non-ASCII do not (an id is logged and compared, never a path).
MEMBER_ID_CHARACTERS = "A-Za-z0-9_.:@%|+-"
_MEMBER_ID = re.compile(f"[{MEMBER_ID_CHARACTERS}]{{1,{MEMBER_ID_MAX_LENGTH}}}")
CONSUMERS_FOLDER = "_consumers"
OFFSETS_FOLDER = "offsets"


def validate_member_id(value: object, *, what: str = "consumer id") -> str:
    """``value`` if it may identify a consumer instance, else :class:`SubscriptionError`."""
    if not isinstance(value, str) or not _MEMBER_ID.fullmatch(value):
        shown = value[:60] if isinstance(value, str) else value
        raise SubscriptionError(
            f"{what} {shown!r} must be 1-{MEMBER_ID_MAX_LENGTH} characters from [{MEMBER_ID_CHARACTERS}]",
            code="INVALID_CONSUMER_ID",
        )
    return value


def allocate_averagely(queue_count: int, members: Sequence[str], current: str) -> list[int]:
    """Queue ids ``0 .. queue_count - 1`` that ``current`` owns: RocketMQ's ``AllocateMessageQueueAveragely``.

    Queues and members are sorted; member ``i`` of ``n`` takes a contiguous
    run of ``queue_count // n`` queues, the first ``queue_count % n`` members
    one more. With more members than queues the last members get none. A
    ``current`` that is not among ``members`` owns nothing (RocketMQ logs
    and returns an empty list). Every queue goes to exactly one member.
    """
    if isinstance(queue_count, bool) or not isinstance(queue_count, int) or queue_count < 1:
        raise SubscriptionError(f"queue count {queue_count!r} must be an int >= 1", code="INVALID_QUEUE_COUNT")
    ordered = sorted(set(members))
    if not ordered:
        raise SubscriptionError("no live consumer to allocate queues to", code="NO_LIVE_CONSUMER")
    if current not in ordered:
        log.info("consumer %r is not among the live consumers %s; it owns no queue", current, ordered)
        return []
    index, count = ordered.index(current), len(ordered)
    share, extra = divmod(queue_count, count)
    size = share + 1 if index < extra else share
    start = index * size if index < extra else index * size + extra
    return list(range(start, min(start + size, queue_count)))


@dataclass(frozen=True)
class Heartbeat:
    """One instance's last heartbeat, as read from its file."""

    member: str
    at: dt.datetime


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Membership:
    """The heartbeat files of one group's CLUSTERING instances in the lake (local file system).

    ``beat`` (over)writes this instance's file atomically; ``live`` lists the
    instances that beat within ``expiry_seconds`` of ``now`` and deletes the
    files of instances dead for long (:meth:`forget_after`); ``leave``
    deletes this instance's file. A file that cannot be read (half-written by
    a crashed writer, or not ours) is skipped with a warning, never fatal.
    """

    lake: str
    group: str
    member: str
    expiry_seconds: float = DEFAULT_HEARTBEAT_EXPIRY_SECONDS

    def __post_init__(self) -> None:
        validate_member_id(self.member)
        expiry = self.expiry_seconds
        if isinstance(expiry, bool) or not isinstance(expiry, int | float) or not 0 < expiry < float("inf"):
            raise SubscriptionError(
                f"heartbeat expiry {expiry!r} must be a positive number of seconds", code="INVALID_OPTION"
            )

    @property
    def folder(self) -> Path:
        return Path(self.lake) / CONSUMERS_FOLDER / f"group-{_digest(self.group)}"

    @property
    def _remote(self) -> bool:
        return storage.is_remote(self.lake)

    def _store(self, sub: str = "") -> tuple[pafs.FileSystem, str]:
        """The group's folder (or its ``sub`` folder) on the lake's object store (with the lake's storage options)."""
        group_uri = f"{self.lake.rstrip('/')}/{CONSUMERS_FOLDER}/group-{_digest(self.group)}"
        return storage.filesystem(_join(group_uri, sub) if sub else group_uri)

    def _files(self, sub: str = "") -> list[tuple[str, str]]:
        """(path, text) of each ``.json`` file of the group's folder (or its ``sub`` folder), sorted; a
        file gone or unreadable between the listing and its read is left out (logged)."""
        out = []
        if not self._remote:
            folder = self.folder / sub if sub else self.folder
            for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
                try:
                    # Bytes that are not UTF-8 make the JSON unreadable (a warning), not an exception here.
                    out.append((str(path), path.read_bytes().decode(errors="replace")))
                except FileNotFoundError:  # left (graceful close) between glob and read
                    continue
                except OSError as exc:
                    log.warning("group %s: skipping unreadable heartbeat file %s: %s", self.group, path, exc)
            return out
        fs, root = self._store(sub)
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        for info in sorted(infos, key=lambda i: i.path):
            if info.type != pafs.FileType.File or not info.base_name.endswith(".json"):
                continue
            try:
                with fs.open_input_stream(info.path) as stream:
                    out.append((info.path, stream.read().decode(errors="replace")))
            except (FileNotFoundError, OSError) as exc:  # left between list and read, or unreadable
                log.info("group %s: heartbeat %s unreadable: %s", self.group, info.path, exc)
        return out

    def _read(self, path: str, sub: str = "") -> str | None:
        """The text of ``path`` as :meth:`_files` (of the same ``sub`` folder) named it; None if gone."""
        try:
            if not self._remote:
                return Path(path).read_bytes().decode(errors="replace")
            fs, _ = self._store(sub)
            with fs.open_input_stream(path) as stream:
                return bytes(stream.read()).decode(errors="replace")
        except (FileNotFoundError, OSError):
            return None

    def _delete(self, path: str, sub: str = "") -> None:
        if not self._remote:
            Path(path).unlink(missing_ok=True)
            return
        fs, _ = self._store(sub)
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            pass

    def _beats(self) -> list[tuple[Heartbeat, str, str]]:
        """Each readable heartbeat of the group with its file's path and text."""
        out = []
        for path, text in self._files():
            beat = _parse_heartbeat(text, path, self.group)
            if beat is not None:
                out.append((beat, path, text))
        return out

    @property
    def file(self) -> Path:
        return self.folder / f"{_digest(self.member)}.json"

    def beat(self, now: dt.datetime | None = None) -> None:
        """Record that this instance is alive at ``now`` (default: the wall clock)."""
        at = now or dt.datetime.now(dt.UTC)
        self._write(self.file.name, json.dumps({"group": self.group, "member": self.member, "heartbeat_at": at.isoformat()}))

    def _write(self, name: str, body: str, sub: str = "") -> None:
        """(Over)write file ``name`` of the group's folder (or its ``sub`` folder) at once."""
        if self._remote:
            # One PUT: an object store never shows half an object, so no rename is needed.
            fs, root = self._store(sub)
            # Through a C++ buffered stream: delta-rs's object stream takes bytes, and pyarrow's
            # Python-level write hands it an Arrow Buffer (TypeError); the C++ path hands bytes.
            # The buffer must exceed the data: a write of a buffer's size or more bypasses it.
            data = body.encode()
            with fs.open_output_stream(_join(root, name)) as raw:
                out = pa.BufferedOutputStream(raw, buffer_size=len(data) + 1)
                out.write(data)
                out.close()
            return
        folder = self.folder / sub if sub else self.folder
        folder.mkdir(parents=True, exist_ok=True)
        # Write then rename: a reader never sees half a file.
        fd, tmp = tempfile.mkstemp(prefix=".write-", dir=folder)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(body)
            os.replace(tmp, folder / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def leave(self) -> None:
        """Graceful close: the others take this instance's queues at their next batch."""
        if self._remote:
            fs, root = self._store()
            self._delete(_join(root, self.file.name))
            return
        self._delete(str(self.file))

    def heartbeats(self) -> list[Heartbeat]:
        """Every readable heartbeat of the group, live or not."""
        return [beat for beat, _, _ in self._beats()]

    def forget_after(self) -> dt.timedelta:
        """How old a heartbeat is when ``live`` deletes its file: :data:`FORGET_AFTER_EXPIRIES`
        expiries, at least :data:`FORGET_AFTER_MIN_SECONDS`."""
        return dt.timedelta(seconds=max(FORGET_AFTER_MIN_SECONDS, FORGET_AFTER_EXPIRIES * self.expiry_seconds))

    def live(self, now: dt.datetime | None = None) -> list[str]:
        """Sorted ids of the instances whose last heartbeat is at most ``expiry_seconds`` old.

        A heartbeat from the future (another host's clock ahead of ours)
        counts as live. This instance always counts: it is running. The file
        of a heartbeat older than :meth:`forget_after` is deleted, if it still
        holds that heartbeat (an instance that came back has rewritten it).
        """
        at = now or dt.datetime.now(dt.UTC)
        oldest = at - dt.timedelta(seconds=self.expiry_seconds)
        beats = self._beats()
        for beat, path, text in beats:
            if beat.at < at - self.forget_after() and beat.member != self.member:
                self._forget(path, text, f"{beat.member}'s heartbeat of {beat.at.isoformat()}")
        members = {b.member for b, _, _ in beats if b.at >= oldest}
        return sorted(members | {self.member})

    # -- consumed offsets (RocketMQ's offset store): what a gainer of a queue need not read again --

    def publish(self, offsets: dict[str, TopicOffsets], now: dt.datetime | None = None) -> None:
        """(Over)write this instance's consumed offsets (``offsets/<hash>.json`` of the group's folder)."""
        at = now or dt.datetime.now(dt.UTC)
        body = {
            "group": self.group,
            "member": self.member,
            "published_at": at.isoformat(),
            "topics": {topic: o.to_json() for topic, o in sorted(offsets.items())},
        }
        self._write(self.file.name, json.dumps(body), OFFSETS_FOLDER)

    def published(self, now: dt.datetime | None = None) -> list[dict[str, TopicOffsets]]:
        """The consumed offsets every instance of the group published, this one's too.

        A file that cannot be read, or says something no offset says, is
        skipped with a warning (its instance's queues are then caught up from
        further back, never less). A file not rewritten for
        :meth:`forget_after` is deleted, if it still holds what was read: the
        queues of an instance gone that long have been caught up since.
        """
        at = now or dt.datetime.now(dt.UTC)
        out = []
        for path, text in self._files(OFFSETS_FOLDER):
            parsed = _parse_offsets(text, path, self.group)
            if parsed is None:
                continue
            published_at, offsets = parsed
            if published_at < at - self.forget_after():
                self._forget(path, text, f"the offsets published at {published_at.isoformat()}", OFFSETS_FOLDER)
                continue
            out.append(offsets)
        return out

    def _forget(self, path: str, text: str, what: str, sub: str = "") -> None:
        """Delete ``path`` if it still holds ``text`` (one that came back has rewritten it since it was
        read). Housekeeping: a file that cannot be deleted is left for the next look."""
        if self._read(path, sub) != text:
            return
        log.info("group %s: forgetting %s (%s)", self.group, what, path)
        try:
            self._delete(path, sub)
        except OSError as exc:
            log.warning("group %s: could not delete %s: %s", self.group, path, exc)


@dataclass(frozen=True)
class TopicOffsets:
    """What one instance consumed of a topic: every row of queue ``q`` (but one ``dlq resend`` wrote
    for a named instance) committed in table ``table`` at a version up to ``through[q]`` has a
    CLUSTERING result of the group.

    The claim holds for that table only (``table``: its Delta id; one re-created at the same
    path starts its versions anew), for the queues as ``queues`` numbers them, and for the rows
    of the subscription's ``tags`` (None: every tag).
    """

    table: str
    queues: int
    tags: tuple[str, ...] | None
    through: dict[int, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "queues": self.queues,
            "tags": None if self.tags is None else list(self.tags),
            "through": {str(q): v for q, v in sorted(self.through.items())},
        }

    @classmethod
    def from_json(cls, data: Any) -> TopicOffsets:
        """Or ValueError/TypeError/KeyError for anything an instance of this release never writes."""
        table, queues, tags, through = data["table"], data["queues"], data["tags"], data["through"]
        if not isinstance(table, str) or not table:
            raise ValueError(f"table {table!r} is not a table id")
        if not is_whole(queues) or queues < 1:
            raise ValueError(f"queues {queues!r} is not a queue count")
        if tags is not None and (not isinstance(tags, list) or not all(isinstance(t, str) for t in tags)):
            raise ValueError(f"tags {tags!r} are not a list of tags")
        if not isinstance(through, dict):
            raise ValueError(f"through {through!r} is not queue -> version")
        versions = {}
        for key, version in through.items():
            versions[_queue(key, queues)] = _version(version)
        return cls(table, queues, None if tags is None else tuple(tags), versions)


def _version(value: object, *, lowest: int = -1) -> int:
    """A table version of a record (-1: before the first; ``lowest`` 0 where a table must be read at it), or
    ValueError."""
    if not is_whole(value) or not lowest <= value < 2**63:
        raise ValueError(f"{value!r} is not a table version")
    return value


def _queue(value: object, count: int) -> int:
    """A queue id (a JSON key) of ``count`` queues, or ValueError."""
    if not (isinstance(value, str) and value.isascii() and value.isdigit()) or int(value) >= count:
        raise ValueError(f"{value!r} is not one of {count} queues")
    return int(value)


def _queue_ids(topic: str, ids: object, count: int) -> tuple[int, ...]:
    """The queue ids (a JSON list) of ``topic``'s ``count`` queues, or ValueError."""
    if not isinstance(ids, list) or not all(is_whole(q) and 0 <= q < count for q in ids):
        raise ValueError(f"queues {ids!r} of {topic!r} are not among its {count}")
    return tuple(ids)


def _tags(value: object) -> tuple[str, ...] | None:
    """A subscription's tags (a list of text, or None for every tag), or ValueError."""
    if value is not None and (not isinstance(value, list) or not all(isinstance(t, str) for t in value)):
        raise ValueError(f"tags {value!r} are not a list of tags")
    return None if value is None else tuple(value)


# What parsing a side file someone else may have written (JSON, then checked field by field) raises
# when the file is not one this release writes: skipped or planned anew, never fatal.
UNREADABLE_RECORD: tuple[type[Exception], ...] = (
    ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError,
)
_UNREADABLE_SIDE_FILE: tuple[type[Exception], ...] = (*UNREADABLE_RECORD, SubscriptionError)


def _parse_offsets(text: str, path: str, group: str) -> tuple[dt.datetime, dict[str, TopicOffsets]] | None:
    try:
        data: Any = json.loads(text)
        if data["group"] != group:
            raise ValueError(f"it belongs to group {data['group']!r}")
        validate_member_id(data["member"])
        at = dt.datetime.fromisoformat(data["published_at"])
        if at.tzinfo is None:
            raise ValueError("published_at has no time zone")
        topics = data["topics"]
        if not isinstance(topics, dict):
            raise ValueError("topics is not topic -> offsets")
        return at, {str(topic): TopicOffsets.from_json(o) for topic, o in topics.items()}
    except _UNREADABLE_SIDE_FILE as exc:
        log.warning("group %s: skipping unreadable offsets file %s: %s", group, path, exc)
        return None


def best_offsets(published: Sequence[dict[str, TopicOffsets]], wanted: dict[str, TopicOffsets]) -> dict[str, dict[int, int]]:
    """Topic -> queue -> the furthest version any instance consumed through, of the claims that fit
    ``wanted`` (this instance's table, queue count and tags per topic; ``through`` unused).

    Every claim that fits is true on its own, so the furthest is.
    """
    best: dict[str, dict[int, int]] = {}
    for offsets in published:
        for topic, claim in offsets.items():
            mine = wanted.get(topic)
            if mine is None or (claim.table, claim.queues, claim.tags) != (mine.table, mine.queues, mine.tags):
                continue
            queues = best.setdefault(topic, {})
            for queue, version in claim.through.items():
                queues[queue] = max(version, queues.get(queue, -1))
    return best


def credible(
    published: dict[str, dict[int, int]], planned: dict[str, int], latest: dict[str, int]
) -> dict[str, dict[int, int]]:
    """The published offsets a plan may use: none past the ``latest`` version (read after the offsets: it
    vouches for commits nobody made, a damaged or forged file), the others no further than the version
    the plan read (``planned``, read before them: an instance may have consumed commits made since,
    and what holds through a version holds through an earlier one)."""
    return {
        topic: {q: min(v, planned[topic]) for q, v in queues.items() if v <= latest.get(topic, -1)}
        for topic, queues in published.items() if topic in planned
    }


def _join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}" if root else name


def _parse_heartbeat(text: str, path: str, group: str) -> Heartbeat | None:
    try:
        data: Any = json.loads(text)
        member, group_of_file = data["member"], data["group"]
        at = dt.datetime.fromisoformat(data["heartbeat_at"])
        if at.tzinfo is None:
            raise ValueError("heartbeat_at has no time zone")
        validate_member_id(member)
    except _UNREADABLE_SIDE_FILE as exc:
        log.warning("group %s: skipping unreadable heartbeat file %s: %s", group, path, exc)
        return None
    if group_of_file != group:
        log.warning("group %s: heartbeat file %s belongs to group %r; skipped", group, path, group_of_file)
        return None
    return Heartbeat(member, at)


# -- one micro-batch's assignment (recorded in the checkpoint, so a replay consumes the same) --


def window_bound(through_version: int) -> str:
    """Stream positions below this are rows of table versions <= ``through_version``, or snapshot rows.

    Positions are the Delta source's ``sourcePositionColumn`` strings:
    ``s<version>/...`` for snapshot files (version unknown, so always inside),
    ``v<version>/...`` for commit files, fixed width, sorting in stream order.
    """
    return f"v{through_version + 1:020d}"


@dataclass(frozen=True)
class Window:
    """Queues of ``topic`` whose rows up to ``through_version`` may already have a result of the group.

    Opened when this instance gains queues another instance may have
    consumed ahead of it (or when it joins a group that consumed before):
    such rows are checked against the group's consume results until the
    stream is past ``through_version``.
    """

    topic: str
    queues: tuple[int, ...]
    through_version: int

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "queues": list(self.queues), "through_version": self.through_version}

    @classmethod
    def from_json(cls, data: Any, queue_counts: dict[str, int] | None = None) -> Window:
        """Or ValueError/TypeError/KeyError/AttributeError for anything this release never writes.

        ``queue_counts`` (the record's, topic -> count): the window's topic must be one of them and its
        queues among that topic's; without them, queue ids that could be any topic's.
        """
        topic = str(data["topic"])
        if queue_counts is not None and topic not in queue_counts:
            raise ValueError(f"window topic {topic!r} is not among the queue counts' {sorted(queue_counts)}")
        count = 2**31 if queue_counts is None else queue_counts[topic]
        return cls(topic, _queue_ids(topic, data["queues"], count), _version(data["through_version"]))


@dataclass(frozen=True)
class Assignment:
    """What one instance consumes in one micro-batch.

    ``owned``: topic (a subscribed topic or ``%RETRY%G``) -> queue ids.
    ``catch_up``: queues gained since the previous batch; their rows up to
    ``catch_up_versions[topic]`` that no instance of the group consumed are
    read again from the table (the previous owner may have stopped before
    reaching them, while this instance's stream had already passed them).
    ``windows``: see :class:`Window`.
    ``catch_up_after``: topic -> a version through which the group consumed
    every row of that topic's gained queues (published offsets): the catch-up
    reads only the files added after it. A topic without one is read whole.
    ``consumed_through``: topic -> queue -> the version through which every
    row of an owned queue has a result of the group once this batch is
    committed (what this instance publishes); a queue whose history this
    instance cannot vouch for (a stream from the latest rows, a lost record)
    has none. ``tags``: topic -> the subscription's tags (None: every tag)
    ``consumed_through`` is for; a later batch under other tags (a restart
    with another subscription) cannot go on from it.
    """

    batch_id: int
    members: tuple[str, ...]
    queue_counts: dict[str, int]
    owned: dict[str, tuple[int, ...]]
    catch_up: dict[str, tuple[int, ...]]
    catch_up_versions: dict[str, int]
    windows: tuple[Window, ...]
    catch_up_after: dict[str, int] = field(default_factory=dict)
    consumed_through: dict[str, dict[int, int]] = field(default_factory=dict)
    tags: dict[str, tuple[str, ...] | None] = field(default_factory=dict)
    streamed: dict[str, int] | None = None
    """The ``stream_through`` it was planned with: a replay whose stream offsets differ vouches for nothing."""

    def of_topics(self, topics: Iterable[str]) -> Assignment:
        """This assignment with only ``topics`` (what a later batch can go on from when the others changed)."""
        keep = set(topics)
        return replace(
            self,
            queue_counts={t: n for t, n in self.queue_counts.items() if t in keep},
            owned={t: q for t, q in self.owned.items() if t in keep},
            catch_up={t: q for t, q in self.catch_up.items() if t in keep},
            catch_up_versions={t: v for t, v in self.catch_up_versions.items() if t in keep},
            windows=tuple(w for w in self.windows if w.topic in keep),
            catch_up_after={t: v for t, v in self.catch_up_after.items() if t in keep},
            consumed_through={t: q for t, q in self.consumed_through.items() if t in keep},
            tags={t: v for t, v in self.tags.items() if t in keep},
            streamed=None if self.streamed is None else {t: v for t, v in self.streamed.items() if t in keep},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "members": list(self.members),
            "queue_counts": dict(self.queue_counts),
            "owned": {t: list(q) for t, q in self.owned.items()},
            "catch_up": {t: list(q) for t, q in self.catch_up.items()},
            "catch_up_versions": dict(self.catch_up_versions),
            "windows": [w.to_json() for w in self.windows],
            "catch_up_after": dict(self.catch_up_after),
            "consumed_through": {t: {str(q): v for q, v in qs.items()} for t, qs in self.consumed_through.items()},
            "tags": {t: None if tags is None else list(tags) for t, tags in self.tags.items()},
            "streamed": self.streamed,
        }

    @classmethod
    def from_json(cls, data: Any) -> Assignment:
        """Or ValueError/TypeError/KeyError/AttributeError for anything this release never writes."""
        counts = {str(t): n for t, n in data["queue_counts"].items()}
        if not all(is_whole(n) and 1 <= n < 2**31 for n in counts.values()):
            raise ValueError(f"queue_counts {counts!r} are not queue counts")

        def queues(topic: str, ids: Any) -> tuple[int, ...]:
            return _queue_ids(topic, ids, counts.get(topic, 0))

        if not is_whole(data["batch_id"]) or not 0 <= data["batch_id"] < 2**63:
            raise ValueError(f"batch_id {data['batch_id']!r} is not a batch id")
        catch_up = {str(t): queues(str(t), qs) for t, qs in data["catch_up"].items()}
        # The catch-up reads each topic's table as of its version: one for every topic caught up, no other.
        versions = {str(t): _version(v, lowest=0) for t, v in data["catch_up_versions"].items()}
        if versions.keys() != catch_up.keys():
            raise ValueError(f"catch_up_versions are for {sorted(versions)}, catch_up for {sorted(catch_up)}")
        return cls(
            batch_id=data["batch_id"],
            members=tuple(str(m) for m in data["members"]),
            queue_counts=counts,
            owned={str(t): queues(str(t), qs) for t, qs in data["owned"].items()},
            catch_up=catch_up,
            catch_up_versions=versions,
            windows=tuple(Window.from_json(w, counts) for w in data["windows"]),
            # Records of earlier releases have neither: read whole, vouch for nothing.
            catch_up_after={str(t): _version(v) for t, v in data.get("catch_up_after", {}).items()},
            consumed_through={
                str(t): {_queue(q, int(data["queue_counts"].get(t, 0))): _version(v) for q, v in qs.items()}
                for t, qs in data.get("consumed_through", {}).items()
            },
            tags={str(t): _tags(tags) for t, tags in data.get("tags", {}).items()},
            streamed=None if data.get("streamed") is None else {str(t): _version(v) for t, v in data["streamed"].items()},
        )


def plan_assignment(
    *,
    batch_id: int,
    members: Sequence[str],
    me: str,
    queue_counts: dict[str, int],
    versions: dict[str, int],
    previous: Assignment | None,
    carried_windows: Sequence[Window] = (),
    restarted: bool = False,
    stream_through: dict[str, int] | None = None,
    published: dict[str, dict[int, int]] | None = None,
    tags: dict[str, tuple[str, ...] | None] | None = None,
) -> Assignment:
    """This instance's queues for ``batch_id`` (pure).

    ``queue_counts``: topic -> number of queues; ``versions``: topic -> the
    latest version of the table its rows come from. Without a ``previous``
    assignment (a new checkpoint) the stream itself reads from its start, so
    nothing is caught up, but every owned queue gets a window: the group may
    have consumed those rows already. With one, gained queues are caught up
    and get a window; ``carried_windows`` are the previous batch's windows
    that are still open. ``restarted``: the first batch this process plans
    on an existing checkpoint; while it was down others may have consumed its
    queues, so every owned queue gets a window, as for a new checkpoint.

    Consumed offsets: ``stream_through`` (topic -> the version through which
    this instance's stream has delivered every row once this batch is done;
    None for a stream from the latest rows, which vouches for nothing) and
    ``published`` (topic -> queue -> the group's furthest published offset,
    :func:`best_offsets`). A queue this stream has owned since its first row
    or since its gain is consumed through the furthest of the stream's
    version, the table version its catch-up read and the offset that
    catch-up started after; the first batch of a new checkpoint reads from
    the first row (with ``previous`` None on a later batch, nothing is known).
    A topic's catch-up starts after the lowest published offset of its
    gained queues, if every one has one. ``tags``: topic -> the
    subscription's tags; a queue goes on from ``previous`` only under the
    same tags (rows of a tag added since were never delivered).
    """
    owned = {topic: tuple(allocate_averagely(count, members, me)) for topic, count in sorted(queue_counts.items())}
    catch_up: dict[str, tuple[int, ...]] = {}
    if previous is None:
        gained = owned
    else:
        # A topic the previous batch did not have (subscribed since, or its queue count changed):
        # as without a previous assignment, its owned queues get windows and nothing is caught up.
        gained = {
            topic: tuple(q for q in queues if q not in previous.owned.get(topic, ()))
            for topic, queues in owned.items()
            if topic in previous.queue_counts
        }
        gained = {topic: queues for topic, queues in gained.items() if queues}
        catch_up = gained
        if restarted:
            gained = owned
        else:
            gained = {**gained, **{t: q for t, q in owned.items() if t not in previous.queue_counts}}
    windows = [w for w in carried_windows if w.topic in owned]
    windows += [Window(topic, queues, versions[topic]) for topic, queues in gained.items() if queues]
    published = published or {}
    catch_up_after = {}
    for topic, queues in catch_up.items():
        bounds = [published.get(topic, {}).get(q) for q in queues]
        if all(b is not None for b in bounds):
            catch_up_after[topic] = min(b for b in bounds if b is not None)
    tags = tags or {}
    unknown = object()

    def same_tags(topic: str) -> bool:
        return previous is not None and previous.tags.get(topic, unknown) == tags.get(topic, unknown)

    through: dict[str, dict[int, int]] = {}
    for topic, queues in owned.items() if stream_through is not None else ():
        # The stream cannot have read past the table's latest version (a damaged offsets log could say so).
        streamed = min(stream_through.get(topic, -1), versions[topic]) if stream_through is not None else -1
        known = {}
        for q in queues:
            if q in catch_up.get(topic, ()):
                known[q] = max(versions[topic], published.get(topic, {}).get(q, -1), streamed)
            elif previous is None:
                if batch_id == 0:
                    known[q] = streamed
            elif q in previous.consumed_through.get(topic, {}) and same_tags(topic):
                known[q] = max(previous.consumed_through[topic][q], streamed)
        if known:
            through[topic] = known
    return Assignment(
        batch_id=batch_id,
        members=tuple(sorted(set(members))),
        queue_counts=dict(sorted(queue_counts.items())),
        owned=owned,
        catch_up=catch_up,
        catch_up_versions={topic: versions[topic] for topic in catch_up},
        windows=tuple(windows),
        catch_up_after=catch_up_after,
        consumed_through=through,
        tags=dict(tags),
        streamed=None if stream_through is None else dict(stream_through),
    )
