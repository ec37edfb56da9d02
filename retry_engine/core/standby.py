"""Standby engines, seen from the lake: ``<lake>/_standby/<host>-<pid>.json``.

``retry-engine run --standby`` on a lake another engine owns waits for its
lease. An operator who relies on it for failover needs to see it: is a
standby there, on which host, since when, and is it still polling? So each
standby writes a small note on the lake's store every time it tries the
lease (every 1-5 s), and deletes it when it takes the lake over or stops.
``status`` lists the notes: a note not renewed within three polls (and 10 s
of clock slack) belongs to a standby that died without a word (SIGKILL, a
lost host) or cannot reach the lake, and shows as ``stale``. A note that cannot be read (bad bytes,
another shape) is shown as unreadable, never fatal: status reads what
anyone may have written there.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import re
import socket
from dataclasses import dataclass
from typing import Any, Final

import pyarrow.fs as pafs

from retry_engine.delta import storage

log = logging.getLogger(__name__)

STANDBY_DIR: Final = "_standby"
# A note is a few hundred bytes; a bigger file is not one (and is not read whole).
MAX_NOTE_BYTES: Final = 8_192
# How many polls a standby may miss before its note is stale, and the clocks' slack.
STALE_POLLS: Final = 3
CLOCK_SLACK: Final = dt.timedelta(seconds=10)
# A note not renewed for this long is a standby that died without a word: the next standby to start
# deletes it, or `status` would list every standby ever killed, for good.
FORGET_AFTER: Final = dt.timedelta(days=1)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class StandbyNote:
    """One standby engine: where it runs, its checkpoint, since when it waits, when it last tried."""

    host: str
    pid: int
    checkpoint: str
    since: dt.datetime
    seen_at: dt.datetime
    poll_s: float

    @property
    def name(self) -> str:
        return f"{_UNSAFE.sub('_', self.host)[:200]}-{self.pid}.json"

    def to_json(self) -> str:
        return json.dumps(
            {
                "host": self.host, "pid": self.pid, "checkpoint": self.checkpoint,
                "since": self.since.isoformat(), "seen_at": self.seen_at.isoformat(), "poll_s": self.poll_s,
            }
        ) + "\n"

    @classmethod
    def from_json(cls, raw: bytes) -> StandbyNote:
        """The note in ``raw``; ``ValueError`` saying why not."""
        if len(raw) > MAX_NOTE_BYTES:
            raise ValueError(f"{len(raw)} bytes, more than a note's {MAX_NOTE_BYTES}")
        try:
            value: Any = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, RecursionError) as exc:
            raise ValueError(f"not a JSON note ({type(exc).__name__})") from exc
        if not isinstance(value, dict):
            raise ValueError(f"a JSON {type(value).__name__}, not an object")
        try:
            note = cls(
                host=_text(value["host"]), pid=_whole(value["pid"]), checkpoint=_text(value["checkpoint"]),
                since=_time(value["since"]), seen_at=_time(value["seen_at"]), poll_s=_seconds(value["poll_s"]),
            )
        except KeyError as exc:
            raise ValueError(f"no {exc.args[0]!r}") from exc
        return note


def _text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a non-empty text")
    return value


def _whole(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a process id")
    return value


def _seconds(value: object) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 3_600:
        raise ValueError(f"{value!r} is not a poll interval in seconds")
    return float(value)


def _time(value: object) -> dt.datetime:
    when = dt.datetime.fromisoformat(_text(value))
    if when.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone")
    return when


@dataclass(frozen=True)
class StandbyEntry:
    """A standby as ``status`` shows it: its note, and whether it still polls (``live``); ``problem``
    instead of a note when the file could not be read."""

    file: str
    note: StandbyNote | None
    live: bool
    problem: str | None = None


def _folder(lake: str) -> tuple[pafs.FileSystem, str]:
    """The notes' folder on the lake's store (a local path or ``file:`` URI, or an object store)."""
    return storage.filesystem(f"{lake.rstrip('/')}/{STANDBY_DIR}")


def _join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}" if root else name


class Standby:
    """The note of this process while it stands by for ``lake``'s lease."""

    def __init__(self, lake: str, checkpoint: str, poll_s: float) -> None:
        now = dt.datetime.now(dt.UTC)
        self.lake = lake
        self.note = StandbyNote(socket.gethostname(), os.getpid(), checkpoint, now, now, poll_s)
        self.written = False

    def seen(self) -> None:
        """Write (or renew) the note; a store that refuses is logged, never raised (the standby goes on)."""
        now = dt.datetime.now(dt.UTC)
        # A new note (the first try, or standing by again after running) waits since now.
        self.note = dataclasses.replace(self.note, seen_at=now, since=self.note.since if self.written else now)
        try:
            fs, root = _folder(self.lake)
            if not self.written:
                fs.create_dir(root, recursive=True)
            # Written aside and renamed over the last one: a `status` in between reads the whole note.
            # The part is named for this process, so a standby killed mid-write leaves one at most.
            part = _join(root, f".{self.note.name}.tmp")
            with fs.open_output_stream(part) as stream:
                stream.write(self.note.to_json().encode("utf-8"))
            fs.move(part, _join(root, self.note.name))
            if not self.written:
                _forget_dead(fs, root, self.lake, now, keep=self.note.name)
            self.written = True
        except Exception as exc:  # noqa: BLE001 - only a note for operators
            log.warning("standby: could not write its note on the lake %s: %s", self.lake, exc)

    def gone(self) -> None:
        """Delete the note (taking the lake over, or stopping)."""
        if not self.written:
            return
        try:
            fs, root = _folder(self.lake)
            fs.delete_file(_join(root, self.note.name))
        except FileNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001 - a stale note says itself that it is stale
            log.warning("standby: could not delete its note on the lake %s: %s", self.lake, exc)
        self.written = False


def _forget_dead(fs: pafs.FileSystem, root: str, lake: str, now: dt.datetime, *, keep: str) -> None:
    """Delete the notes (other than ``keep``) not renewed since :data:`FORGET_AFTER` before ``now``, each
    only if it still holds the note read (a standby that came back has renewed it)."""
    for entry in standbys(lake, now=now):
        note = entry.note
        if note is None or entry.file == keep or now - note.seen_at <= FORGET_AFTER:
            continue
        path = _join(root, entry.file)
        try:
            with fs.open_input_stream(path) as stream:
                still = StandbyNote.from_json(stream.read(MAX_NOTE_BYTES + 1)) == note
            if still:
                fs.delete_file(path)
                log.info("standby: deleted the note of %s pid %d, not renewed since %s", note.host, note.pid,
                         note.seen_at.isoformat())
        except (FileNotFoundError, ValueError):  # gone or rewritten meanwhile
            continue


def standbys(lake: str, *, now: dt.datetime) -> list[StandbyEntry]:
    """The standby notes on ``lake``, by file name; an unreadable one with its problem."""
    fs, root = _folder(lake)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except FileNotFoundError:
        return []
    found = []
    for info in sorted(infos, key=lambda i: i.path):
        if info.type != pafs.FileType.File or not info.base_name.endswith(".json"):
            continue
        try:
            with fs.open_input_stream(info.path) as stream:
                raw = stream.read(MAX_NOTE_BYTES + 1)
            note = StandbyNote.from_json(raw)
        except FileNotFoundError:  # deleted between the listing and the read: it took over or stopped
            continue
        except (ValueError, OSError) as exc:
            found.append(StandbyEntry(info.base_name, None, False, str(exc)[:200]))
            continue
        stale_after = dt.timedelta(seconds=STALE_POLLS * note.poll_s) + CLOCK_SLACK
        found.append(StandbyEntry(info.base_name, note, now - note.seen_at <= stale_after))
    return found


__all__ = ["STANDBY_DIR", "Standby", "StandbyEntry", "StandbyNote", "standbys"]
