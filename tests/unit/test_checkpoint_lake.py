"""Which lake a checkpoint runs (``<checkpoint>/retry_engine_lake.json``): two lakes never share one.

Real Delta tables (the lakes' ``_engine_state``, written by the real lease), no Spark: the engine
calls :func:`check` before it writes anything and :func:`record` under the lease; the integration
test (test_monitoring) starts a real engine on another lake's checkpoint.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import time
from pathlib import Path

import pytest

from retry_engine.config import EngineConfig, parse_config
from retry_engine.core import checkpoint_lake
from retry_engine.core.lease import LakeLease, Owner
from retry_engine.errors import LakeResumeError


def _lake(root: Path, checkpoint: Path) -> EngineConfig:
    return parse_config({"engine": {"lake": str(root), "checkpoint": str(checkpoint)}})


def _started(config: EngineConfig) -> None:
    """What an engine's start leaves: the lake's lease table, and the checkpoint's record of the lake."""
    owner = Owner("host", 1, "q", config.checkpoint_path, dt.datetime.now(dt.UTC))
    lease = LakeLease(config.engine.lake, owner, timeout_ms=30_000)
    lease.acquire()
    checkpoint_lake.record(config, checkpoint_lake.check(config))
    lease.release()


def test_a_checkpoint_records_its_lake_and_refuses_another(tmp_path: Path) -> None:
    checkpoint = tmp_path / "shared-checkpoint"
    a, b = _lake(tmp_path / "a", checkpoint), _lake(tmp_path / "b", checkpoint)
    _started(a)
    recorded = checkpoint_lake.read(str(checkpoint))
    assert recorded == checkpoint_lake.CheckpointLake(checkpoint_lake.lake_id(str(tmp_path / "a")) or "", str(tmp_path / "a"))
    assert checkpoint_lake.check(a) == recorded  # its own lake, again
    # Another lake, before it ever ran (no engine state) and after it ran on its own checkpoint.
    with pytest.raises(LakeResumeError, match=r"\[CHECKPOINT_OF_ANOTHER_LAKE\].*has no engine state yet"):
        checkpoint_lake.check(b)
    _started(_lake(tmp_path / "b", tmp_path / "b-checkpoint"))
    with pytest.raises(LakeResumeError, match=r"\[CHECKPOINT_OF_ANOTHER_LAKE\].*runs the lake at .*/a \(lake "):
        checkpoint_lake.check(b)
    assert checkpoint_lake.read(str(checkpoint)) == recorded  # refused: nothing rewritten


def test_a_moved_lake_keeps_its_checkpoint_and_the_record_follows_it(tmp_path: Path) -> None:
    """A lake copied elsewhere with its checkpoint is the same lake (its tables keep their ids)."""
    old = _lake(tmp_path / "old", tmp_path / "old" / "_checkpoints" / "engine")
    _started(old)
    shutil.copytree(tmp_path / "old", tmp_path / "new")
    new = _lake(tmp_path / "new", tmp_path / "new" / "_checkpoints" / "engine")
    recorded = checkpoint_lake.check(new)
    assert recorded is not None and recorded.lake == str(tmp_path / "old")
    checkpoint_lake.record(new, recorded)
    moved = checkpoint_lake.read(new.checkpoint_path)
    assert moved == checkpoint_lake.CheckpointLake(recorded.lake_id, str(tmp_path / "new"))


def test_a_checkpoint_of_an_earlier_release_is_recorded_at_its_next_start(tmp_path: Path) -> None:
    config = _lake(tmp_path / "lake", tmp_path / "ckpt")
    (tmp_path / "ckpt").mkdir()
    # What a start killed between writing aside and renaming leaves, and a file that only looks like it.
    part = tmp_path / "ckpt" / f"{checkpoint_lake.LAKE_FILE}.{'a' * 32}.tmp"
    part.write_text('{"lake_id": "half')
    old = time.time() - checkpoint_lake.PART_AGE_S - 1
    os.utime(part, (old, old))
    # One being written by a start in progress (another lake's, maybe), and a file that only looks like one.
    fresh = tmp_path / "ckpt" / f"{checkpoint_lake.LAKE_FILE}.{'b' * 32}.tmp"
    fresh.write_text('{"lake_id": "hal')
    other = tmp_path / "ckpt" / f"{checkpoint_lake.LAKE_FILE}.not-a-part.tmp"
    other.write_text("kept")
    os.utime(other, (old, old))
    assert checkpoint_lake.read(config.checkpoint_path) is None
    _started(config)
    assert checkpoint_lake.read(config.checkpoint_path) is not None
    assert not part.exists() and fresh.exists() and other.read_text() == "kept"


@pytest.mark.parametrize("links", [True, False], ids=["hard links", "no hard links"])
def test_two_lakes_starting_at_once_on_one_new_checkpoint_one_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, links: bool
) -> None:
    """Both checked before either recorded (the race of two services started together): the first record
    stays, the second start is refused, whichever order their writes come in; also on a file system
    without hard links (some network and FUSE ones), where a look comes first."""
    if not links:
        def no_links(src: str, dst: str) -> None:
            raise PermissionError(1, "Operation not permitted", dst)

        monkeypatch.setattr(os, "link", no_links)
    checkpoint = tmp_path / "new-checkpoint"
    a, b = _lake(tmp_path / "a", checkpoint), _lake(tmp_path / "b", checkpoint)
    for config in (a, b):
        LakeLease(config.engine.lake, Owner("h", 1, "q", str(checkpoint), dt.datetime.now(dt.UTC)), timeout_ms=30_000).acquire()
    assert checkpoint_lake.check(a) is None and checkpoint_lake.check(b) is None
    checkpoint_lake.record(a, None)
    with pytest.raises(LakeResumeError, match=r"\[CHECKPOINT_OF_ANOTHER_LAKE\]"):
        checkpoint_lake.record(b, None)
    recorded = checkpoint_lake.read(str(checkpoint))
    assert recorded is not None and recorded.lake == str(tmp_path / "a")
    assert [p.name for p in checkpoint.iterdir()] == [checkpoint_lake.LAKE_FILE]  # no part left


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[]",
        b"null",
        b'"a lake"',
        b'{"lake": "/x"}',
        b'{"lake_id": 7, "lake": "/x"}',
        b'{"lake_id": "", "lake": "/x"}',
        b'{"lake_id": "id", "lake": null}',
        b'{"lake_id": ["id"], "lake": "/x"}',
        b"\xff\xfe\x00garbage",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"lake_id": "' + b"x" * 10_000 + b'", "lake": "/x"}',
        b"",
    ],
    ids=lambda c: repr(c[:24]),
)
def test_a_damaged_record_is_refused_with_what_to_do_and_left_as_it_is(tmp_path: Path, content: bytes) -> None:
    config = _lake(tmp_path / "lake", tmp_path / "ckpt")
    _started(config)
    path = tmp_path / "ckpt" / checkpoint_lake.LAKE_FILE
    path.write_bytes(content)
    with pytest.raises(LakeResumeError, match=r"\[CHECKPOINT_LAKE_FILE_INVALID\] .*retry_engine_lake.json holds .*delete it"):
        checkpoint_lake.check(config)
    assert path.read_bytes() == content
