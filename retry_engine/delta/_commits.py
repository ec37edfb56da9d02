"""Reading a Delta table's log: versions, snapshot files and per-commit actions.

delta-rs has no public "files added in commit v" API, so commits are read from
``_delta_log/{v:020d}.json`` the way Delta's own streaming source does. Only
local paths (and ``file://`` URIs) are supported for the log tail.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable

from retry_engine.errors import DeltaSourceError

# Table features this reader handles; anything else is refused with a clear error.
SUPPORTED_READER_FEATURES = frozenset({"timestampNtz"})


def local_path(uri: str) -> str:
    return uri[len("file://") :] if uri.startswith("file://") else uri


@dataclass(frozen=True)
class FileEntry:
    """One data file to stream: where it is and where it sits in the stream."""

    path: str
    size: int
    partition_values: dict[str, str | None]
    version: int
    index: int
    is_starting_version: bool
    modification_time: int = 0

    @property
    def offset(self) -> dict[str, Any]:
        return {"reservoirVersion": self.version, "index": self.index, "isStartingVersion": self.is_starting_version}


@dataclass
class DeltaLog:
    """The log of one table, with the snapshot listing cached per version."""

    uri: str
    _snapshots: dict[int, list[FileEntry]] = field(default_factory=dict)

    def table(self, version: int | None = None) -> DeltaTable:
        try:
            return DeltaTable(self.uri, version=version)
        except Exception as exc:  # delta-rs raises TableNotFoundError / DeltaError
            raise DeltaSourceError(f"{self.uri} is not a readable Delta table: {exc}", code="NOT_A_DELTA_TABLE") from exc

    def latest_version(self) -> int:
        return self.table().version()

    def arrow_schema(self, version: int | None = None) -> pa.Schema:
        table = self.table(version)
        check_protocol(table, self.uri)
        return pa.schema(table.schema().to_arrow())

    def partition_columns(self) -> list[str]:
        return list(self.table().metadata().partition_columns)

    def snapshot(self, version: int) -> list[FileEntry]:
        """Files of the snapshot at ``version``, in a deterministic order."""
        if version not in self._snapshots:
            table = self.table(version)
            check_protocol(table, self.uri)
            rows = pa.table(table.get_add_actions(flatten=True)).to_pylist()
            rows.sort(key=lambda r: (r["modification_time"], r["path"]))
            self._snapshots = {
                version: [
                    FileEntry(
                        path=r["path"],
                        size=int(r["size_bytes"]),
                        partition_values={k[len("partition.") :]: v for k, v in r.items() if k.startswith("partition.")},
                        version=version,
                        index=i,
                        is_starting_version=True,
                        modification_time=int(r["modification_time"]),
                    )
                    for i, r in enumerate(rows)
                ]
            }
        return self._snapshots[version]

    def commit(self, version: int) -> list[dict[str, Any]] | None:
        """Actions of commit ``version``, or None when it does not exist (yet)."""
        name = os.path.join(local_path(self.uri), "_delta_log", f"{version:020d}.json")
        try:
            with open(name, encoding="utf-8") as handle:
                return [json.loads(line) for line in handle if line.strip()]
        except FileNotFoundError:
            return None

    def commit_files(self, version: int, *, ignore_deletes: bool, skip_change_commits: bool) -> list[FileEntry] | None:
        """Data files added by commit ``version`` (dataChange adds only); None if absent."""
        actions = self.commit(version)
        if actions is None:
            return None
        adds = [a["add"] for a in actions if "add" in a and a["add"].get("dataChange", True)]
        removes = [a["remove"] for a in actions if "remove" in a and a["remove"].get("dataChange", True)]
        if any("protocol" in a for a in actions):
            check_protocol(self.table(version), self.uri)
        if removes:
            if skip_change_commits:
                return []
            if not (ignore_deletes and not adds):
                raise DeltaSourceError(
                    f"commit {version} of {self.uri} removes data ({len(removes)} files); a stream cannot "
                    "follow it. Set option skipChangeCommits=true to skip such commits, or "
                    "ignoreDeletes=true to ignore commits that only delete",
                    code="DELTA_SOURCE_REMOVE_IN_COMMIT",
                )
        return [
            FileEntry(
                path=a["path"],
                size=int(a.get("size", 0)),
                partition_values=dict(a.get("partitionValues") or {}),
                version=version,
                index=i,
                is_starting_version=False,
                modification_time=int(a.get("modificationTime", 0)),
            )
            for i, a in enumerate(adds)
        ]

    def files_after(
        self,
        offset: dict[str, Any],
        *,
        until_version: int,
        ignore_deletes: bool = False,
        skip_change_commits: bool = False,
    ) -> Iterator[FileEntry]:
        """Every file after ``offset`` up to and including version ``until_version``, in stream order."""
        version, index = int(offset["reservoirVersion"]), int(offset["index"])
        if offset["isStartingVersion"]:
            for entry in self.snapshot(version):
                if entry.index > index:
                    yield entry
            version, index = version + 1, -1
        while version <= until_version:
            files = self.commit_files(version, ignore_deletes=ignore_deletes, skip_change_commits=skip_change_commits)
            if files is None:
                break
            for entry in files:
                if entry.index > index:
                    yield entry
            version, index = version + 1, -1


def file_path(uri: str, relative: str) -> str:
    """Absolute path of a data file named in the log (paths there are URL-encoded)."""
    return os.path.join(local_path(uri), unquote(relative))


def check_protocol(table: DeltaTable, uri: str) -> None:
    protocol = table.protocol()
    features = set(protocol.reader_features or [])
    unsupported = sorted(features - SUPPORTED_READER_FEATURES)
    if protocol.min_reader_version > 3 or unsupported:
        raise DeltaSourceError(
            f"{uri} needs reader version {protocol.min_reader_version} with features {unsupported}; "
            f"this reader supports version <= 3 with {sorted(SUPPORTED_READER_FEATURES)} "
            "(use Spark's native delta format on a cluster that has the Delta jars)",
            code="DELTA_UNSUPPORTED_FEATURE",
        )
