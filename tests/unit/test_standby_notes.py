"""A standby engine's note on the lake (B8): written while it polls, gone when it takes over or stops,
listed by ``status`` (live or stale), and anything else found there shown as unreadable, never fatal.

The note's life in a real standby process is asserted in tests/integration/test_standby.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import socket
from pathlib import Path

import pytest
from deltalake import write_deltalake

from retry_engine.config import parse_config
from retry_engine.core.standby import STANDBY_DIR, Standby, StandbyNote, standbys
from retry_engine.ops.status import format_status, status, status_json
from retry_engine.schemas import DLQ

NOW = dt.datetime(2026, 11, 28, 12, tzinfo=dt.UTC)


def _note(**changes: object) -> bytes:
    note = StandbyNote("host-b", 42, "/ckpt", NOW - dt.timedelta(minutes=5), NOW - dt.timedelta(seconds=2), 5.0)
    return dataclasses.replace(note, **changes).to_json().encode()  # type: ignore[arg-type]


def test_a_standby_writes_renews_and_deletes_its_note(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    standby = Standby(lake, "/ckpt", 2.0)
    assert standbys(lake, now=NOW) == []
    standby.seen()
    (entry,) = standbys(lake, now=dt.datetime.now(dt.UTC))
    assert entry.live and entry.note is not None
    assert (entry.note.host, entry.note.pid, entry.note.checkpoint) == (socket.gethostname(), os.getpid(), "/ckpt")
    first = entry.note.seen_at
    standby.seen()
    (again,) = standbys(lake, now=dt.datetime.now(dt.UTC))
    assert again.note is not None and again.note.seen_at > first and again.note.since == entry.note.since
    # Three polls (2 s each) and the clock slack (10 s) later it is stale: a standby that died silently.
    late = again.note.seen_at + dt.timedelta(seconds=3 * 2 + 10, milliseconds=1)
    assert [e.live for e in standbys(lake, now=late)] == [False]
    standby.gone()
    assert standbys(lake, now=NOW) == []
    standby.gone()  # twice is harmless


def test_a_store_that_refuses_the_note_does_not_stop_the_standby(tmp_path: Path) -> None:
    blocker = tmp_path / "lake"
    blocker.mkdir()
    (blocker / STANDBY_DIR).write_text("a file where the folder should be")
    standby = Standby(str(blocker), "/ckpt", 1.0)
    standby.seen()  # logged, not raised
    standby.gone()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"not json", "Expecting value"),
        (b"[1, 2]", "a JSON list, not an object"),
        (b"null", "a JSON NoneType, not an object"),
        (b'{"host": "h"}', "no 'pid'"),
        (_note(pid=-1), "is not a process id"),
        (_note(pid=True), "is not a process id"),
        (_note(host=""), "is not a non-empty text"),
        (_note(poll_s=0), "is not a poll interval"),
        (b'{"host": "h", "pid": 1, "checkpoint": "c", "since": "2026-11-28T12:00:00+00:00", '
         b'"seen_at": "2026-11-28T12:00:00+00:00", "poll_s": NaN}', "is not a poll interval"),
        (b'{"host": "h", "pid": 1, "checkpoint": "c", "since": "2026-11-28T12:00:00", '
         b'"seen_at": "2026-11-28T12:00:00+00:00", "poll_s": 1}', "has no time zone"),
        (b'{"host": "h", "pid": 1, "checkpoint": "c", "since": "yesterday", '
         b'"seen_at": "2026-11-28T12:00:00+00:00", "poll_s": 1}', "Invalid isoformat"),
        (b"\xff\xfe garbage", "not a JSON note (UnicodeDecodeError)"),
        (b"[" * 50_000 + b"]" * 50_000, "more than a note's 8192"),
        (b"[" * 4_000 + b"]" * 4_000, "not a JSON note (RecursionError)"),
        (b" " * 9_000, "more than a note's 8192"),
        (b"", "Expecting value"),
    ],
    ids=lambda v: repr(v[:20]) if isinstance(v, bytes) else None,
)
def test_status_shows_whatever_else_is_in_the_standby_folder_as_unreadable(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    folder = tmp_path / STANDBY_DIR
    folder.mkdir(parents=True)
    (folder / "x.json").write_bytes(content)
    (folder / "good.json").write_bytes(_note())
    (folder / "notes.txt").write_text("not a note's name: not listed")
    (folder / "dir.json").mkdir()
    good, bad = standbys(str(tmp_path), now=NOW)
    assert (good.file, good.live, bad.file, bad.note, bad.live) == ("good.json", True, "x.json", None, False)
    assert bad.problem is not None and problem in bad.problem, bad.problem


def test_status_lists_the_standbys_of_the_lake_and_goes_on_without_a_readable_folder(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    write_deltalake(str(lake / "dlq"), DLQ.arrow_schema.empty_table())  # an engine table: the lake is found
    config = parse_config({"engine": {"lake": str(lake)}})
    (lake / STANDBY_DIR).mkdir()
    now = dt.datetime.now(dt.UTC)
    (lake / STANDBY_DIR / "host-b-42.json").write_bytes(_note(seen_at=now, since=now - dt.timedelta(hours=1)))
    got = status(config)
    (entry,) = got.standbys
    assert entry.live and entry.note is not None and entry.note.host == "host-b"
    assert "standby     host-b pid 42, waiting since " in format_status(got)
    assert status_json(got)["standbys"][0]["note"]["pid"] == 42
    (lake / STANDBY_DIR / "host-b-42.json").unlink()
    (lake / STANDBY_DIR).rmdir()
    (lake / STANDBY_DIR).write_text("a file, not a folder")
    assert status(config).standbys == []


def test_a_file_uri_lake_keeps_its_notes_where_its_path_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``file:///...`` and the plain path are one lake: a note written through one is read through the
    other, and nothing lands in the working directory."""
    monkeypatch.chdir(tmp_path)
    lake = tmp_path / "lake"
    standby = Standby(f"file://{lake}", "/ckpt", 1.0)
    standby.seen()
    assert [e.file for e in standbys(str(lake), now=dt.datetime.now(dt.UTC))] == [standby.note.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lake"]
    assert [p.name for p in (lake / STANDBY_DIR).iterdir()] == [standby.note.name]  # no part left behind
    standby.gone()
    assert standbys(f"file://{lake}", now=NOW) == []


def test_what_anyone_wrote_in_a_note_stays_on_its_own_status_line(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    write_deltalake(str(lake / "dlq"), DLQ.arrow_schema.empty_table())
    (lake / STANDBY_DIR).mkdir()
    now = dt.datetime.now(dt.UTC)
    forged = _note(host="h\nquery       running: forged", checkpoint="/c\x1b[2J", seen_at=now)
    (lake / STANDBY_DIR / "x.json").write_bytes(forged)
    (lake / STANDBY_DIR / "bad\nname.json").write_bytes(b"[]")
    text = format_status(status(parse_config({"engine": {"lake": str(lake)}})))
    standby_lines = [line for line in text.splitlines() if line.startswith("standby")]
    assert len(standby_lines) == 2 and "forged" in standby_lines[1] and "\\n" in standby_lines[1]
    assert "\\x1b[2J" in standby_lines[1] and "\x1b" not in text
    assert not any(line.startswith("query       running: forged") for line in text.splitlines())


def test_a_standby_that_starts_deletes_the_notes_of_standbys_dead_for_a_day(tmp_path: Path) -> None:
    """#14 (months on a lake): a standby killed without a word (SIGKILL, a lost host) left its note for
    good, and `status` listed every one ever killed as stale. A standby that starts deletes the notes
    not renewed for a day; recent stale ones (status still shows them), live ones and files that are
    not notes stay."""
    lake = str(tmp_path / "lake")
    folder = tmp_path / "lake" / STANDBY_DIR
    folder.mkdir(parents=True)
    now = dt.datetime.now(dt.UTC)
    (folder / "dead-1.json").write_bytes(_note(pid=1, seen_at=now - dt.timedelta(days=3)))
    (folder / "dead-2.json").write_bytes(_note(pid=2, seen_at=now - dt.timedelta(hours=25)))
    (folder / "stale-3.json").write_bytes(_note(pid=3, seen_at=now - dt.timedelta(hours=2)))
    (folder / "live-4.json").write_bytes(_note(pid=4, seen_at=now))
    (folder / "junk.json").write_bytes(b"\xff not a note")
    standby = Standby(lake, "/ckpt", 2.0)
    standby.seen()
    standby.seen()  # only its first write looks
    names = {e.file for e in standbys(lake, now=now)}
    assert names == {"stale-3.json", "live-4.json", "junk.json", standby.note.name}
    standby.gone()
