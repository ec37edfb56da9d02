"""Damaged checkpoint side files (review B, probes p6/p7): ``retry_engine_resume.json`` and
``retry_engine_state_keys.json`` holding what the engine never writes stop the start with one coded
error naming the file, not a traceback; the resume file is written aside and renamed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from retry_engine.core import resume
from retry_engine.core.resume import RESUME_FILE, ResumePoint
from retry_engine.errors import LakeResumeError, RetryEngineError, StateUnreadableError

FLOOR = "v00000000000000000009/000003/"
GOOD = {"startingVersion": 9, "positionFloor": FLOOR, "afterBatch": "query-A/5"}


def _with(**changes: object) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


def _without(key: str) -> bytes:
    return json.dumps({k: v for k, v in GOOD.items() if k != key}).encode()


HOSTILE: dict[str, bytes] = {
    "truncated": b'{"startingVersion": 1, "afterBatch": "q/0"',
    "empty": b"",
    "array": b"[]",
    "null": b"null",
    "string": b'"x"',
    "number": b"7",
    "version-string": _with(startingVersion="x"),
    "version-digits": _with(startingVersion="9"),
    "version-float": _with(startingVersion=9.0),
    "version-null": _with(startingVersion=None),
    "version-negative": _with(startingVersion=-1),
    "version-huge": _with(startingVersion=2**63),
    "version-true": _with(startingVersion=True),
    "version-false": _with(startingVersion=False, positionFloor=None),
    "version-nan": b'{"startingVersion": NaN, "positionFloor": null, "afterBatch": "q/0"}',
    "floor-number": _with(positionFloor=3),
    "floor-list": _with(positionFloor=[FLOOR]),
    "floor-garbage": _with(positionFloor="zzz"),
    "floor-other-commit": _with(positionFloor="v00000000000000000008/000003/"),
    "floor-snapshot": _with(positionFloor="s00000000000000000009/000003/"),
    "floor-unicode-digits": _with(positionFloor="v0000000000000000000\u0669/000003/"),
    "after-number": _with(afterBatch=5),
    "after-empty": _with(afterBatch=""),
    "after-null": _with(afterBatch=None),
    "no-version": _without("startingVersion"),
    "no-floor": _without("positionFloor"),
    "no-after": _without("afterBatch"),
    "not-utf8": b'\xff\xfe{"startingVersion": 9, "positionFloor": null, "afterBatch": "q/0"}',
    "nested-arrays": b"[" * 4_000 + b"]" * 4_000,
    "nested-objects": b'{"a":' * 2_000 + b"1" + b"}" * 2_000,
    "huge-digits": b'{"startingVersion": '
    + b"9" * 4_050
    + b', "positionFloor": null, "afterBatch": "q/0"}',
    "too-long": _with(afterBatch="q/" + "0" * 5_000),
}


@pytest.mark.parametrize("content", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_damaged_resume_file_is_one_coded_error_naming_the_file(
    tmp_path: Path, content: bytes
) -> None:
    (tmp_path / RESUME_FILE).write_bytes(content)
    with pytest.raises(LakeResumeError) as caught:
        resume.stored(str(tmp_path))
    message = str(caught.value)
    assert message.startswith("[RESUME_FILE_INVALID] ")
    assert caught.value.code == "RESUME_FILE_INVALID"
    assert f"{tmp_path}/{RESUME_FILE}" in message
    assert '"startingVersion"' in message and "restore it from a backup" in message
    assert len(message) < 2_000
    # Left as it is for the operator to look at.
    assert (tmp_path / RESUME_FILE).read_bytes() == content


def _parsed(content: bytes) -> object:
    try:
        return json.loads(content.decode("utf-8"))
    except (ValueError, RecursionError):
        return _UNPARSED


_UNPARSED = object()
# The hostile values that are JSON (the length of the file is resume.stored's check, not from_json's).
PARSED = {
    k: _parsed(v) for k, v in HOSTILE.items() if k != "too-long" and _parsed(v) is not _UNPARSED
}


@pytest.mark.parametrize("data", list(PARSED.values()), ids=list(PARSED))
def test_from_json_converts_nothing(data: object) -> None:
    """``from_json`` itself takes only what ``to_json`` writes (ValueError otherwise), whatever the caller."""
    with pytest.raises(ValueError):
        ResumePoint.from_json(data)


@pytest.mark.parametrize(
    "point",
    [
        ResumePoint(9, FLOOR, "query-A/5"),
        ResumePoint(4, None, "query-A/5"),
        ResumePoint(0, "v00000000000000000000/000001/", "q/0"),
        ResumePoint(2**63 - 1, f"v{2**63 - 1:020d}/1234567/", "q/1"),
    ],
)
def test_a_stored_point_reads_back(tmp_path: Path, point: ResumePoint) -> None:
    checkpoint = str(tmp_path / "checkpoint")
    assert resume.stored(checkpoint) is None
    resume.store(checkpoint, point)
    assert resume.stored(checkpoint) == point
    assert ResumePoint.from_json(point.to_json()) == point
    assert [p.name for p in (tmp_path / "checkpoint").iterdir()] == [RESUME_FILE]


def test_the_point_plan_writes_reads_back(tmp_path: Path) -> None:
    """What :func:`resume.plan` decides after a batch that ended inside a commit passes the checks."""
    from retry_engine.delta._files import position_prefix

    point = ResumePoint(12, position_prefix(12, 1, False), "query-A/0")
    resume.store(str(tmp_path), point)
    assert resume.stored(str(tmp_path)) == point


class _FailingStream:
    """An output stream that writes the first half of what it is given, then fails (a full disk)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __enter__(self) -> _FailingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.close()

    def write(self, data: bytes) -> int:
        self._stream.write(data[: len(data) // 2])
        raise OSError("No space left on device")


class _FailingWrites:
    """A local file system whose output streams fail midway."""

    def __init__(self) -> None:
        self._fs = pafs.LocalFileSystem()
        self.opened: list[str] = []

    def open_output_stream(self, path: str, *args: Any, **kwargs: Any) -> _FailingStream:
        self.opened.append(path)
        return _FailingStream(self._fs.open_output_stream(path, *args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)


def test_a_store_that_fails_midway_leaves_the_old_file_and_no_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = str(tmp_path)
    old = ResumePoint(4, None, "query-A/5")
    resume.store(checkpoint, old)
    before = (tmp_path / RESUME_FILE).read_bytes()

    failing = _FailingWrites()
    monkeypatch.setattr(resume, "checkpoint_filesystem", lambda _: (failing, str(tmp_path)))
    with pytest.raises(OSError, match="No space left"):
        resume.store(checkpoint, ResumePoint(9, FLOOR, "query-B/7"))
    assert failing.opened, "the store wrote nothing"

    assert (tmp_path / RESUME_FILE).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [RESUME_FILE]
    monkeypatch.undo()
    assert resume.stored(checkpoint) == old


def test_a_store_replaces_a_damaged_file(tmp_path: Path) -> None:
    (tmp_path / RESUME_FILE).write_bytes(HOSTILE["truncated"])
    point = ResumePoint(3, None, "q/1")
    resume.store(str(tmp_path), point)
    assert resume.stored(str(tmp_path)) == point


@pytest.mark.parametrize(
    "content",
    [
        b'\xff\xfe{"subkeys": 1}',
        b'{"subkeys": 1, "split_since_ms": null, "x": "\xe9"}',
        b"[" * 4_000 + b"]" * 4_000,
        b'{"subkeys": ' + b"1" * 4_400 + b', "split_since_ms": null}',
    ],
    ids=["not-utf8-bom", "not-utf8-latin1", "nested-arrays", "huge-digits"],
)
def test_a_keys_file_that_is_no_utf8_json_is_state_keys_file_invalid(
    tmp_path: Path, content: bytes
) -> None:
    from retry_engine.core.schedule import KEYS_FILE, state_key_split

    (tmp_path / KEYS_FILE).write_bytes(content)
    with pytest.raises(StateUnreadableError) as caught:
        state_key_split(str(tmp_path), bucket_ms=1000, now_ms=0)
    message = str(caught.value)
    assert message.startswith("[STATE_KEYS_FILE_INVALID] ")
    assert f"{tmp_path}/{KEYS_FILE}" in message and "restore it from a backup" in message.lower()
    assert (tmp_path / KEYS_FILE).read_bytes() == content


def test_the_cli_prints_one_line_for_a_damaged_resume_file(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What ``retry-engine run`` shows: the CLI turns the coded error into one line and exit 1."""
    from retry_engine.ops import cli

    (tmp_path / RESUME_FILE).write_bytes(HOSTILE["array"])

    def run(_args: object) -> int:
        resume.stored(str(tmp_path))
        return 0

    assert issubclass(LakeResumeError, RetryEngineError)
    monkeypatch.setattr(cli, "_check", run)
    assert cli.main(["check-config"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("retry-engine: [RESUME_FILE_INVALID] ") and err.count("\n") == 1
    assert "Traceback" not in err
