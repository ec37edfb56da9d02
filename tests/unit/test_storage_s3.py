"""The lake on object storage without Spark (#14 part 4): options, secrets, commit safety, on moto's S3 server.

Every table is opened through :mod:`retry_engine.delta.storage` with the config's
``[storage]`` options; credentials are never shown; S3 settings under which
two writers could commit one table version are refused.
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties

from retry_engine.clients.rebalance import CONSUMERS_FOLDER, Membership
from retry_engine.config import load_config, parse_config
from retry_engine.delta import storage
from retry_engine.delta._log import TableLocation
from retry_engine.delta.lake import require_lake
from retry_engine.delta.sink import SinkOptions
from retry_engine.delta.source import SourceOptions
from retry_engine.delta.tables import append_arrow, ensure_table, open_table, read_table
from retry_engine.errors import ConfigError, LakeNotFoundError
from retry_engine.ops.cli import EXIT_ERROR, EXIT_OK, main
from tests.builders import append_at_once
from tests.s3 import S3Server

SECRET = "s3cr3t-" + uuid.uuid4().hex


def _toml(options: dict[str, Any], lake: str) -> str:
    lines = ["[engine]", f'lake = "{lake}"', 'checkpoint = "/tmp/ckpt"', "", "[storage]"]
    for key, value in options.items():
        lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- secrets


def test_a_secret_storage_option_is_never_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#14 part 4: a credential in [storage] is not in check-config, reprs or error messages; other options are."""
    conf = tmp_path / "engine.toml"
    options = {
        "aws_region": "eu-west-3",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "aws_session_token": SECRET + "-tok",
    }
    conf.write_text(_toml(options, "s3://bucket/lake"))

    assert main(["check-config", "--config", str(conf)]) == EXIT_OK
    out = capsys.readouterr()
    assert "storage          aws_region = eu-west-3" in out.out
    assert "storage          aws_secret_access_key = ***" in out.out
    assert "storage          aws_session_token = ***" in out.out
    assert SECRET not in out.out + out.err

    config = load_config(conf)
    # The options do reach delta-rs (keys lower-cased, as delta-rs accepts them).
    assert storage.options_for("s3://bucket/lake/dlq") == {
        "aws_region": "eu-west-3",
        "aws_secret_access_key": SECRET,
        "aws_session_token": SECRET + "-tok",
    }
    shown = [
        repr(config),
        str(config),
        repr(
            SourceOptions.parse(
                {"path": "s3://bucket/lake/dlq", "storage.aws_secret_access_key": SECRET}
            )
        ),
        repr(
            SinkOptions.parse(
                {"path": "s3://bucket/lake/dlq", "storage.AWS_SECRET_ACCESS_KEY": SECRET}
            )
        ),
        repr(TableLocation("s3://bucket/lake/dlq", {"aws_secret_access_key": SECRET})),
        repr(storage.location("s3://bucket/lake/dlq")),
    ]
    for text in shown:
        assert SECRET not in text

    # Hostile values: a list, a table, a non-table [storage]: the error names the key, never the value.
    for bad in (
        {"aws_secret_access_key": [SECRET]},
        {"aws_secret_access_key": {"v": SECRET}},
        SECRET,
    ):
        with pytest.raises(ConfigError, match="INVALID_STORAGE_OPTION") as caught:
            parse_config({"engine": {"lake": "s3://bucket/lake"}, "storage": bad})
        assert SECRET not in str(caught.value)


def test_spark_options_carry_the_lake_options_and_only_for_its_tables() -> None:
    """#14 part 4: the deltars source/sink get the config's options as storage.<key>; local paths get none."""
    parse_config(
        {"engine": {"lake": "s3://opts-bucket/lake"}, "storage": {"AWS_REGION": "ap-south-1"}}
    )
    assert storage.spark_options("s3://opts-bucket/lake/retry") == {
        "storage.aws_region": "ap-south-1"
    }
    assert storage.spark_options("s3://opts-bucket/other") == {}
    assert storage.spark_options("/tmp/lake/retry") == {}
    parsed = SourceOptions.parse(
        {"path": "s3://x/t", "STORAGE.AWS_REGION": "eu-north-1", "maxFilesPerTrigger": "3"}
    )
    assert parsed.storage_options == {"aws_region": "eu-north-1"}
    assert parsed.location.storage_options == {"aws_region": "eu-north-1"}


# --------------------------------------------------------------------------- commit safety


UNSAFE = [
    ({"aws_s3_allow_unsafe_rename": "true"}, "aws_s3_allow_unsafe_rename"),
    ({"AWS_S3_ALLOW_UNSAFE_RENAME": True}, "aws_s3_allow_unsafe_rename"),
    ({"aws_conditional_put": "disabled"}, "aws_conditional_put = 'disabled'"),
    ({"conditional_put": "disabled"}, "aws_conditional_put = 'disabled'"),
    ({"aws_s3_locking_provider": "none"}, "aws_s3_locking_provider = 'none'"),
    (
        {"aws_s3_locking_provider": "zookeeper", "aws_conditional_put": "disabled"},
        "aws_s3_locking_provider",
    ),
]


@pytest.mark.parametrize(("options", "named"), UNSAFE)
def test_unsafe_commit_settings_are_refused(
    tmp_path: Path, options: dict[str, Any], named: str
) -> None:
    """#14 part 4: settings letting two writers commit one version on S3 stop every command, with a stable code."""
    conf = tmp_path / "engine.toml"
    conf.write_text(_toml(options, "s3://bucket/unsafe"))
    with pytest.raises(ConfigError, match=rf"\[UNSAFE_OBJECT_STORE_COMMITS\].*{named}") as caught:
        load_config(conf)
    assert caught.value.code == "UNSAFE_OBJECT_STORE_COMMITS"
    assert "conditional writes" in str(caught.value) and "dynamodb" in str(caught.value)
    assert main(["check-config", "--config", str(conf)]) == EXIT_ERROR
    # A table of an otherwise local lake on S3 is checked too.
    with pytest.raises(ConfigError, match="UNSAFE_OBJECT_STORE_COMMITS"):
        parse_config(
            {
                "engine": {"lake": str(tmp_path)},
                "tables": {"dlq": "s3://bucket/dlq"},
                "storage": options,
            }
        )


def test_unsafe_rename_from_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """#14 part 4: delta-rs also reads AWS_S3_ALLOW_UNSAFE_RENAME from the environment; so does the check."""
    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
    with pytest.raises(ConfigError, match="UNSAFE_OBJECT_STORE_COMMITS"):
        parse_config({"engine": {"lake": "s3://bucket/env"}})
    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "false")
    parse_config({"engine": {"lake": "s3://bucket/env"}})


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"aws_conditional_put": "etag"},
        {"aws_s3_locking_provider": "dynamodb"},
        {"aws_s3_locking_provider": "DynamoDB", "aws_conditional_put": "disabled"},
        {"aws_s3_allow_unsafe_rename": "false"},
    ],
)
def test_safe_commit_settings_are_accepted(options: dict[str, Any]) -> None:
    """#14 part 4: delta-rs's default (conditional put), etag and a DynamoDB lock are safe."""
    config = parse_config({"engine": {"lake": "s3://bucket/safe"}, "storage": options})
    assert config.storage == {k.lower(): str(v) for k, v in options.items()}


def test_unsafe_settings_do_not_matter_for_a_local_lake(tmp_path: Path) -> None:
    """#14 part 4: on a local disk delta-rs commits with an atomic rename; the S3 settings are unused."""
    parse_config(
        {"engine": {"lake": str(tmp_path)}, "storage": {"aws_s3_allow_unsafe_rename": "true"}}
    )


def test_the_server_refuses_a_second_conditional_create(s3_server: S3Server) -> None:
    """The S3 API under test honours If-None-Match (what delta-rs commits with), so the races below are real."""
    from botocore.exceptions import ClientError

    bucket = s3_server.new_bucket()
    client = s3_server.client()
    client.put_object(
        Bucket=bucket, Key="_delta_log/00000000000000000001.json", Body=b"first", IfNoneMatch="*"
    )
    with pytest.raises(ClientError, match="PreconditionFailed|412"):
        client.put_object(
            Bucket=bucket,
            Key="_delta_log/00000000000000000001.json",
            Body=b"second",
            IfNoneMatch="*",
        )
    body = client.get_object(Bucket=bucket, Key="_delta_log/00000000000000000001.json")[
        "Body"
    ].read()
    assert body == b"first"


def test_two_writers_from_one_snapshot_never_both_commit_its_next_version(
    s3_server: S3Server,
) -> None:
    """#14 part 4: both writers read version v; the first commits v+1, the second's commit of v+1 fails."""
    bucket = s3_server.new_bucket()
    lake = f"s3://{bucket}/lake"
    parse_config({"engine": {"lake": lake}, "storage": s3_server.storage_options()})
    path = f"{lake}/retry"
    append_arrow(path, pa.table({"writer": ["setup"]}))
    first, second = storage.open_delta(path), storage.open_delta(path)
    start = first.version()
    assert second.version() == start
    no_retry = CommitProperties(max_commit_retries=0)
    write_deltalake(
        first, pa.table({"writer": ["first"]}), mode="append", commit_properties=no_retry
    )
    with pytest.raises(CommitFailedError):
        write_deltalake(
            second, pa.table({"writer": ["second"]}), mode="append", commit_properties=no_retry
        )
    assert storage.open_delta(path).version() == start + 1
    assert sorted(read_table(path).column("writer").to_pylist()) == ["first", "setup"]
    # With delta-rs's normal retries the second writer's append lands as the next version instead: nothing lost.
    write_deltalake(second, pa.table({"writer": ["second"]}), mode="append")
    assert storage.open_delta(path).version() == start + 2
    assert sorted(read_table(path).column("writer").to_pylist()) == ["first", "second", "setup"]


CREATE_ROUNDS = 4


def test_writers_creating_one_table_at_once_on_the_object_store_leave_one_create(s3_server: S3Server) -> None:
    """#14 part 4 / B8: two writers append to a table that does not exist yet, at once, 4 times.
    The loser of the create does not commit a second create (delta-rs would rebase it onto version 1,
    failing the winner's next append); both rows land."""
    bucket = s3_server.new_bucket()
    lake = f"s3://{bucket}/lake"
    parse_config({"engine": {"lake": lake}, "storage": s3_server.storage_options()})
    for i in range(CREATE_ROUNDS):
        path = f"{lake}/t{i}"
        errors = append_at_once(path, [pa.table({"writer": [w]}) for w in ("a", "b")])
        assert errors == [], f"round {i}"
        log = {k: v for k, v in s3_server.objects(bucket).items() if k.startswith(f"lake/t{i}/_delta_log/")}
        assert [k for k, v in log.items() if b'"metaData"' in v] == [f"lake/t{i}/_delta_log/{0:020d}.json"]
        assert sorted(read_table(path).column("writer").to_pylist()) == ["a", "b"]


WRITERS = 3
APPENDS = 4


def _append_from_another_process(conf: str, writer: int) -> None:
    """One writer process: loads the config (its own registry), appends APPENDS idempotent transactions."""
    config = load_config(conf)
    path = config.table_path("outcomes")
    for k in range(APPENDS):
        append_arrow(
            path, pa.table({"writer": [writer], "k": [k]}), app_id=f"writer-{writer}", txn_version=k
        )


def test_concurrent_writer_processes_lose_no_commit(s3_server: S3Server, tmp_path: Path) -> None:
    """#14 part 4: processes appending to one S3 table at once: every commit lands once, versions have no gap."""
    bucket = s3_server.new_bucket()
    conf = tmp_path / "engine.toml"
    conf.write_text(_toml(s3_server.storage_options(), f"s3://{bucket}/lake"))
    config = load_config(conf)
    path = config.table_path("outcomes")
    ensure_table(path, pa.schema([("writer", pa.int64()), ("k", pa.int64())]))

    # spawn: delta-rs's runtime does not survive fork.
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_append_from_another_process, args=(str(conf), w))
        for w in range(WRITERS)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=180)
    assert [p.exitcode for p in processes] == [0] * WRITERS

    rows = read_table(path).to_pylist()
    assert sorted((r["writer"], r["k"]) for r in rows) == [
        (w, k) for w in range(WRITERS) for k in range(APPENDS)
    ]
    table = open_table(path)
    assert table is not None and table.version() == WRITERS * APPENDS
    keys = set(s3_server.objects(bucket))
    commits = sorted(
        k for k in keys if k.startswith("lake/outcomes/_delta_log/") and k.endswith(".json")
    )
    assert commits == [
        f"lake/outcomes/_delta_log/{v:020d}.json" for v in range(WRITERS * APPENDS + 1)
    ]
    # Replaying a writer (same app id and versions) adds nothing.
    _append_from_another_process(str(conf), 0)
    assert read_table(path).num_rows == WRITERS * APPENDS


# --------------------------------------------------------------------------- the lake's other files


def test_consumer_heartbeats_live_on_the_object_store(s3_server: S3Server) -> None:
    """#14 part 4: CLUSTERING instances of one group find each other through the S3 lake."""
    bucket = s3_server.new_bucket()
    lake = f"s3://{bucket}/lake"
    parse_config({"engine": {"lake": lake}, "storage": s3_server.storage_options()})
    first, second = Membership(lake, "G1", "host-a"), Membership(lake, "G1", "host-b")
    first.beat()
    second.beat()
    assert first.live() == ["host-a", "host-b"]
    # A stray object (hostile bytes) in the group's folder is skipped, not fatal.
    group_prefix = next(
        iter(k for k in s3_server.objects(bucket) if k.startswith(f"lake/{CONSUMERS_FOLDER}/"))
    )
    folder = group_prefix.rsplit("/", 1)[0]
    s3_server.client().put_object(
        Bucket=bucket, Key=f"{folder}/junk.json", Body=b"\xff\xfe not json"
    )
    assert Membership(lake, "G1", "host-c").live() == ["host-a", "host-b", "host-c"]
    second.leave()
    assert first.live() == ["host-a"]
    # An instance killed a week ago without leaving: the next `live` deletes its object, once.
    killed = Membership(lake, "G1", "host-killed")
    killed.beat(dt.datetime.now(dt.UTC) - dt.timedelta(days=7))
    key = f"{folder}/{killed.file.name}"
    assert key in s3_server.objects(bucket)
    assert first.live() == ["host-a"] and key not in s3_server.objects(bucket)
    assert f"{folder}/junk.json" in s3_server.objects(bucket)
    assert not any(k.startswith("s3:") for k in (p.name for p in Path(".").iterdir()))


def test_consumer_offsets_live_on_the_object_store(s3_server: S3Server) -> None:
    """#14 part 4: a gainer finds the offsets the group published in the S3 lake; the heartbeat
    listing does not see them; offsets published a week ago are deleted by the next read, once."""
    from retry_engine.clients.rebalance import TopicOffsets, best_offsets

    bucket = s3_server.new_bucket()
    lake = f"s3://{bucket}/lake"
    parse_config({"engine": {"lake": lake}, "storage": s3_server.storage_options()})
    first, gone = Membership(lake, "G1", "host-a"), Membership(lake, "G1", "host-gone")
    first.publish({"orders": TopicOffsets("t-1", 4, None, {0: 7, 1: 8})})
    gone.publish({"orders": TopicOffsets("t-1", 4, None, {2: 9})}, dt.datetime.now(dt.UTC) - dt.timedelta(days=7))
    first.beat()
    assert first.live() == ["host-a"]  # the offsets folder is no heartbeat
    wanted = {"orders": TopicOffsets("t-1", 4, None, {})}
    assert best_offsets(first.published(), wanted) == {"orders": {0: 7, 1: 8}}
    keys = [k for k in s3_server.objects(bucket) if "/offsets/" in k]
    assert len(keys) == 1 and keys[0].endswith(first.file.name)


def test_an_empty_s3_lake_is_named_as_given(s3_server: S3Server) -> None:
    """#14 part 4: `status`/`dlq` on a lake URI with no tables say so, naming the URI (not a local folder)."""
    bucket = s3_server.new_bucket()
    config = parse_config(
        {"engine": {"lake": f"s3://{bucket}/nothing"}, "storage": s3_server.storage_options()}
    )
    with pytest.raises(
        LakeNotFoundError, match=rf"no lake at s3://{bucket}/nothing: it holds no engine table"
    ):
        require_lake(config, origin="the test")
    append_arrow(config.table_path("dlq"), pa.table({"x": [1]}))
    require_lake(config, origin="the test")


def test_readme_object_storage_example_is_valid_config(tmp_path: Path) -> None:
    """#14 part 4: the README's [storage] example loads, is safe, and puts every table under the S3 lake."""
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```toml\n(.*?)```", readme, flags=re.S) if "[storage]" in b]
    conf = tmp_path / "c.toml"
    conf.write_text(block)
    config = load_config(conf)
    assert config.storage == {"aws_region": "eu-west-1"}
    assert config.table_path("dlq") == "s3://my-bucket/retry-lake/dlq"
    assert not storage.is_remote(config.checkpoint_path)


def test_maintain_compacts_checkpoints_and_records_on_the_object_store(s3_server: S3Server) -> None:
    """#14 parts 1 and 4: `maintain` on an S3 lake opens every table with the lake's [storage] options.

    Three small appends become one file (dataChange=false, the rows unchanged), the log gets a
    checkpoint, and the run is recorded in the lake's _maintenance table on the server.
    """
    from retry_engine.ops.maintenance import RECORD_TABLE, maintenance_path, run_maintenance

    bucket = s3_server.new_bucket()
    config = parse_config(
        {"engine": {"lake": f"s3://{bucket}/lake"}, "storage": s3_server.storage_options()}
    )
    dlq = config.table_path("dlq")
    for n in range(3):
        append_arrow(dlq, pa.table({"msg_id": [f"m{n}"], "n": [n]}))

    report, record = run_maintenance(config, tables=["dlq"])
    # The record table did not exist before this first run: nothing to maintain yet.
    assert record.table_name == RECORD_TABLE and record.missing

    assert report.error is None, report.error
    assert (report.files_before, report.files_after, report.files_compacted) == (3, 1, 3)
    assert report.checkpoint_version == report.version_after
    table = storage.open_delta(dlq)
    assert sorted(table.to_pyarrow_table().column("msg_id").to_pylist()) == ["m0", "m1", "m2"]
    assert len(table.file_uris()) == 1
    assert any(
        k.startswith("lake/dlq/_delta_log/") and k.endswith(".checkpoint.parquet")
        for k in s3_server.objects(bucket)
    )
    recorded = read_table(maintenance_path(config.engine.lake))
    assert recorded is not None and recorded.column("table_name").to_pylist() == ["dlq"]
    # The next run maintains the record table on the server too, and records that.
    _, record = run_maintenance(config, tables=["dlq"])
    assert record.table_name == RECORD_TABLE and record.error is None and not record.missing
    recorded = read_table(maintenance_path(config.engine.lake))
    assert recorded is not None and sorted(recorded.column("table_name").to_pylist()) == [
        RECORD_TABLE, "dlq", "dlq"
    ]


def test_progress_and_metrics_rows_expire_on_the_object_store(s3_server: S3Server) -> None:
    """#14 parts 1 and 4: the row retention's plan (statistics), the metrics marker and the commit of
    removes go through the lake's [storage] options: 40-day-old rows go, this hour's stay."""
    from retry_engine.core.metrics import EXPIRED
    from retry_engine.ops.maintenance import run_maintenance
    from retry_engine.schemas import METRICS, PROGRESS

    bucket = s3_server.new_bucket()
    config = parse_config({"engine": {"lake": f"s3://{bucket}/lake"}, "storage": s3_server.storage_options()})
    now = dt.datetime.now(dt.UTC)
    for age in (dt.timedelta(days=40), dt.timedelta(minutes=5)):
        at = now - age
        append_arrow(config.table_path("progress"), pa.Table.from_pylist(
            [{**dict.fromkeys(PROGRESS.names), "query_id": "q", "run_id": "r", "event": "idle",
              "event_time": at, "recorded_at": at}], schema=PROGRESS.arrow_schema))
        append_arrow(config.table_path("metrics"), pa.Table.from_pylist(
            [{**dict.fromkeys(METRICS.names), "batch_id": 1, "batch_time": at, "metric": "retry", "value": 1.0}],
            schema=METRICS.arrow_schema))
    reports = {r.table_name: r for r in run_maintenance(config, tables=["progress", "metrics"])}
    assert {n: (reports[n].files_expired, reports[n].rows_expired, reports[n].error) for n in ("progress", "metrics")} == {
        "progress": (1, 1, None), "metrics": (1, 1, None)}
    progress = read_table(config.table_path("progress"))
    metrics = read_table(config.table_path("metrics"))
    assert progress is not None and metrics is not None
    assert [t > now - dt.timedelta(hours=1) for t in progress.column("recorded_at").to_pylist()] == [True]
    assert sorted(metrics.column("metric").to_pylist()) == sorted([EXPIRED, "retry"])


def test_an_engine_start_moves_old_partition_folders_on_the_object_store(
    s3_server: S3Server,
) -> None:
    """#13 part 3 on #14 part 4: the layout migration at start opens S3 tables with the lake's options.

    Regression: the engine start called ``migrate_partition_folders(uri)`` with no options, so
    delta-rs asked the EC2 metadata service for credentials and the start failed on every S3 lake.
    The table is main's old layout (``consumer_5Fgroup=...`` folders) uploaded as it is.
    """
    from retry_engine.delta.layout import migrate_partition_folders, misplaced_files

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "main_layout" / "dlq"
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    for file in sorted(p for p in fixture.rglob("*") if p.is_file()):
        client.put_object(
            Bucket=bucket,
            Key=f"lake/dlq/{file.relative_to(fixture).as_posix()}",
            Body=file.read_bytes(),
        )
    config = parse_config(
        {"engine": {"lake": f"s3://{bucket}/lake"}, "storage": s3_server.storage_options()}
    )
    dlq = config.table_path("dlq")
    before = sorted(storage.open_delta(dlq).to_pyarrow_table().column("msg_id").to_pylist())

    done = migrate_partition_folders(dlq)

    assert done.files_moved == 2 and done.rows_moved == len(before)
    table = storage.open_delta(dlq)
    assert misplaced_files(table) == []
    assert sorted(table.to_pyarrow_table().column("msg_id").to_pylist()) == before
    assert all("/dlq/consumer_group=" in uri and "_5F" not in uri for uri in table.file_uris())


def test_an_old_engine_table_gains_the_releases_nullable_columns_on_the_object_store(
    s3_server: S3Server,
) -> None:
    """#13 part 2, upgrade: the column is added through the lake's [storage] options (not IMDS credentials)."""
    bucket = s3_server.new_bucket()
    config = parse_config(
        {"engine": {"lake": f"s3://{bucket}/lake"}, "storage": s3_server.storage_options()}
    )
    path = config.table_path("progress")
    old = pa.schema([pa.field("query_id", pa.string(), nullable=False)])
    append_arrow(path, pa.table({"query_id": ["q-old"]}, schema=old))
    new = pa.schema([*old, pa.field("reason", pa.string())])

    ensure_table(path, new, add_missing=True)

    append_arrow(path, pa.table({"query_id": ["q-new"], "reason": ["stopped"]}, schema=new))
    rows = read_table(path).sort_by("query_id").to_pylist()
    assert rows == [
        {"query_id": "q-new", "reason": "stopped"},
        {"query_id": "q-old", "reason": None},
    ]


# --------------------------------------------------------------------------- a store that fails

# What delta-rs 1.6.6 raised (a bare OSError) when the AWS credential chain found nothing and
# ended at the instance metadata service, which this sandbox's proxy refuses: recorded, since a
# test cannot rely on what 169.254.169.254 does on the machine running it.
_NO_CREDENTIALS = (
    "Kernel error -> Generic S3 error\n"
    "          \x1b[31m↳\x1b[0m Error performing PUT http://169.254.169.254/latest/api/token in 1.7ms"
    " - Server returned non-2xx status code\n"
    "           \x1b[31m↳\x1b[0m 403 Forbidden\n"
    "            \x1b[31m↳\x1b[0m resolve_deny\n"
    "             \x1b[31m↳\x1b[0m denied destination\n"
)


def _clean(text: str) -> None:
    for raw in ("Traceback", "\x1b[", "↳", "<Error>", "<?xml", "RequestId", SECRET):
        assert raw not in text, f"{raw!r} in:\n{text}"


@pytest.mark.parametrize(
    "command",
    [["status"], ["dlq", "list"], ["dlq", "stats"], ["maintain", "--dry-run"], ["redrive", "list"]],
)
def test_a_missing_bucket_is_named_with_what_to_check(
    s3_server: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """Bad-input rule, #14 part 4: a lake URI whose bucket does not exist is a one-line error, not a traceback."""
    bucket = f"gone-{uuid.uuid4().hex[:8]}"
    conf = tmp_path / "engine.toml"
    conf.write_text(_toml(s3_server.storage_options(SECRET), f"s3://{bucket}/lake"))

    assert main([*command, "--config", str(conf)]) == EXIT_ERROR

    err = capsys.readouterr().err
    assert f"retry-engine: [NO_SUCH_BUCKET] cannot reach s3://{bucket}/lake/" in err, err
    assert "The specified bucket does not exist" in err and "check the URI" in err, err
    assert len(err.strip().splitlines()) == 1, err
    _clean(err)


def test_a_store_that_does_not_answer_is_named_with_what_to_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad-input rule, #14 part 4: a wrong endpoint (nothing listening) says so, with the setting to check."""
    from tests.s3 import free_port

    options = {
        "aws_endpoint_url": f"http://127.0.0.1:{free_port()}",
        "aws_region": "us-east-1",
        "aws_allow_http": "true",
        "aws_access_key_id": "k",
        "aws_secret_access_key": SECRET,
    }
    conf = tmp_path / "engine.toml"
    conf.write_text(_toml(options, "s3://lake/here"))

    assert main(["dlq", "list", "--config", str(conf)]) == EXIT_ERROR

    err = capsys.readouterr().err
    assert "retry-engine: [STORAGE_UNREACHABLE] cannot reach s3://lake/here/" in err, err
    assert "Connection refused" in err and "check aws_endpoint_url" in err, err
    _clean(err)


def test_the_notebook_api_raises_a_storage_error_that_is_an_oserror(s3_server: S3Server) -> None:
    """#14 part 4: `dlq.dead_letters` on a missing bucket raises StorageError (also an OSError, as before)."""
    from retry_engine import dlq
    from retry_engine.errors import StorageError

    bucket = f"gone-{uuid.uuid4().hex[:8]}"
    config = parse_config({"engine": {"lake": f"s3://{bucket}/lake"}, "storage": s3_server.storage_options()})
    with pytest.raises(StorageError, match=r"^\[NO_SUCH_BUCKET\] cannot reach s3://") as caught:
        dlq.dead_letters(config)
    assert isinstance(caught.value, OSError) and caught.value.code == "NO_SUCH_BUCKET"
    assert isinstance(caught.value.__cause__, OSError)  # delta-rs's own error stays attached


def test_no_credentials_are_named_with_where_to_give_them() -> None:
    """A credential chain that found nothing: the causes on one line and where credentials come from."""
    error = storage.storage_error("s3://bucket/lake/dlq", OSError(_NO_CREDENTIALS))

    assert error.code == "NO_CREDENTIALS"
    assert str(error) == (
        "[NO_CREDENTIALS] cannot reach s3://bucket/lake/dlq: Kernel error -> Generic S3 error: "
        "Error performing PUT http://169.254.169.254/latest/api/token in 1.7ms - Server returned non-2xx "
        "status code: 403 Forbidden: resolve_deny: denied destination; no credentials were found: set "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or an instance role), or "
        "aws_access_key_id and aws_secret_access_key in [storage]"
    )


def test_a_secret_the_store_echoes_is_not_shown() -> None:
    """Secrets stay out of error messages even when the store's answer repeats one (a short value is not searched)."""
    lake = f"s3://echo-{uuid.uuid4().hex[:8]}/lake"
    parse_config({"engine": {"lake": lake}, "storage": {"aws_secret_access_key": SECRET, "aws_access_key_id": "k"}})

    error = storage.storage_error(f"{lake}/dlq", OSError(f"403 Forbidden\n  ↳ SignatureDoesNotMatch for {SECRET}"))

    assert error.code == "ACCESS_DENIED" and SECRET not in str(error) and "for ***" in str(error), str(error)
    assert "Forbidden" in str(error)  # "k" (the key id) is too short to be searched for


def test_only_delta_rs_bare_storage_errors_are_translated() -> None:
    """A FileNotFoundError or delta-rs's TableNotFoundError passes through `reaching` as it is."""
    from deltalake.exceptions import TableNotFoundError

    from retry_engine.errors import StorageError

    for exc in (FileNotFoundError("x"), TableNotFoundError("y")):
        with pytest.raises(type(exc)) as caught, storage.reaching("s3://b/t"):
            raise exc
        assert caught.value is exc
    with pytest.raises(StorageError, match=r"^\[STORAGE_UNAVAILABLE\] cannot reach s3://b/t: disk on fire$"):
        with storage.reaching("s3://b/t"):
            raise OSError("disk on fire")


def test_a_send_to_a_store_that_went_away_fails_naming_it_in_one_line(s3_server: S3Server) -> None:
    """R12-style send failure on an outage: the producer's SendFailedError carries the one-line storage error."""
    from retry_engine.clients.producer import Producer
    from retry_engine.errors import SendFailedError

    lake = f"s3://{s3_server.new_bucket()}/lake"
    parse_config({"engine": {"lake": lake}, "storage": s3_server.storage_options()})
    producer = Producer(f"{lake}/messages", retry_times_when_send_failed=1, send_timeout_ms=30_000)
    producer.send("orders", b"one")
    # The same lake, its endpoint now answering nothing (how a store's outage looks to a client).
    gone = s3_server.unreachable_options()
    parse_config({"engine": {"lake": lake}, "storage": gone})

    with pytest.raises(SendFailedError) as caught:
        producer.send("orders", b"two")

    assert f"[STORAGE_UNREACHABLE] cannot reach {lake}/messages" in str(caught.value), str(caught.value)
    assert "\x1b[" not in str(caught.value) and "↳" not in str(caught.value)


def test_a_progress_flush_the_store_refuses_is_a_one_line_warning_and_keeps_its_rows(
    s3_server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    """B7 during an outage: the recorder's failed appends warned with a traceback every flush; now one line."""
    import logging

    from pyspark.sql.streaming.listener import QueryProgressEvent

    from retry_engine.ops.monitor import ProgressRecorder
    from tests.unit.test_monitor import QUERY, progress_json

    lake = f"s3://{s3_server.new_bucket()}/lake"
    gone = s3_server.unreachable_options()
    parse_config({"engine": {"lake": lake}, "storage": gone})
    recorder = ProgressRecorder(f"{lake}/progress", query_id=QUERY, flush_interval_ms=60_000)
    recorder.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(0)}))

    with caplog.at_level(logging.WARNING, logger="retry_engine.ops.monitor"):
        assert recorder.flush() == 0

    (record,) = [r for r in caplog.records if "could not append 1 rows" in r.getMessage()]
    assert record.levelno == logging.WARNING and not record.exc_info
    assert "; will retry: [STORAGE_UNREACHABLE] cannot reach" in record.getMessage()
    parse_config({"engine": {"lake": lake}, "storage": s3_server.storage_options()})
    assert recorder.flush() == 1  # the rows were kept for the store's return


def test_rows_a_closed_recorder_could_not_write_are_written_by_the_next_on_its_table(s3_server: S3Server) -> None:
    """B7 across `run`'s restart after an outage: the failed run's events (its terminated event) were dropped
    with its recorder; the restarted query's recorder on the same table now writes them first."""
    from pyspark.sql.streaming.listener import QueryProgressEvent

    from retry_engine.ops.monitor import ProgressRecorder
    from tests.unit.test_monitor import QUERY, progress_json

    lake = f"s3://{s3_server.new_bucket()}/lake"
    gone = s3_server.unreachable_options()
    parse_config({"engine": {"lake": lake}, "storage": gone})
    first = ProgressRecorder(f"{lake}/progress", query_id=QUERY, flush_interval_ms=60_000)
    first.start()
    first.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(7)}))
    first.close(timeout=30)
    assert first.closed and first.rows_written == 0

    parse_config({"engine": {"lake": lake}, "storage": s3_server.storage_options()})
    second = ProgressRecorder(f"{lake}/progress", query_id=QUERY, flush_interval_ms=60_000)
    assert second.flush() == 1
    assert read_table(f"{lake}/progress")["batch_id"].to_pylist() == [7]
    assert ProgressRecorder(f"{lake}/progress", query_id=QUERY, flush_interval_ms=60_000).flush() == 0  # once


def test_in_engine_maintenance_on_a_store_gone_away_logs_one_line_each_round(
    s3_server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    """#14 parts 1, 4 during an outage: the maintenance thread logged delta-rs's multi-line chain with a
    traceback each due round (as the heartbeat did every beat); now one warning line, and the stream's
    writer and the thread go on."""
    import logging
    import time

    from retry_engine.ops.maintenance import EngineMaintenance

    lake = f"s3://{s3_server.new_bucket()}/lake"
    parse_config({"engine": {"lake": lake}, "storage": s3_server.storage_options()})
    append_arrow(f"{lake}/outcomes", pa.table({"n": [1]}))  # reachable at first: a table to maintain
    config = parse_config(
        {"engine": {"lake": lake}, "storage": s3_server.unreachable_options(), "maintenance": {"every_batches": 1}}
    )
    maintenance = EngineMaintenance(config)
    written: list[int] = []
    write = maintenance.wrap(lambda frame, batch_id: written.append(batch_id))
    with caplog.at_level(logging.WARNING):
        maintenance.start(alive=lambda: True)
        try:
            write(None, 0)
            deadline = time.monotonic() + 60
            while "in-engine maintenance failed" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.1)
            write(None, 1)
        finally:
            maintenance.stop()
    failed = [r for r in caplog.records if "in-engine maintenance failed" in r.getMessage()]
    assert failed and all(r.levelno == logging.WARNING and not r.exc_info for r in failed), caplog.text
    message = failed[0].getMessage()
    assert "the next due run retries: [STORAGE_UNREACHABLE] cannot reach" in message and "\n" not in message
    assert written == [0, 1]


def test_status_counts_consume_results_on_s3_from_the_log_and_reads_only_mixed_files(s3_server: S3Server) -> None:
    """A file of one group is counted from the Delta log; on S3 too only the files of several groups are read
    (matched by their paths: without the one-group file's object the count is the same)."""
    from retry_engine.delta._log import add_actions
    from retry_engine.ops.status import _results_by_group

    bucket = s3_server.new_bucket()
    config = parse_config({"engine": {"lake": f"s3://{bucket}/lake"}, "storage": s3_server.storage_options()})
    path = config.table_path("consume_results")
    for groups in (["G"] * 3, ["G", "H", "a b"], ["H"] * 2):
        append_arrow(path, pa.table({"consumer_group": pa.array(groups, pa.string())}))

    def written() -> dict[str | None, int]:
        counted = _results_by_group(path)
        assert counted is not None
        return dict(zip(counted["consumer_group"].to_pylist(), counted["results"].to_pylist(), strict=True))

    assert written() == {"G": 4, "H": 3, "a b": 1}
    actions = add_actions(storage.open_delta(path)).to_pylist()
    (one,) = [a["path"] for a in actions if a["max.consumer_group"] == "G"]
    s3_server.client().delete_object(Bucket=bucket, Key=f"lake/consume_results/{one}")
    assert written() == {"G": 4, "H": 3, "a b": 1}


_EXPIRED = (
    "Generic S3 error: Error performing GET in 2ms\n  ↳ Server returned non-2xx status code: 400 Bad Request: "
    '<?xml version="1.0" encoding="UTF-8"?><Error><Code>ExpiredToken</Code><Message>The provided token has '
    "expired.</Message><Token-0>SEKRET-TOKEN-from-env-123</Token-0><RequestId>R1</RequestId></Error>"
)


def test_a_credential_the_store_echoes_reaches_no_message_traceback_or_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A review (session 20) made a proxy answer with S3's ExpiredToken body, which echoes the session token:
    it reached the progress table's ``exception`` column and Spark's log, through a DeltaSourceError that
    quoted delta-rs's text and a StorageError chained to it (the README: never in logs or tables). A token
    from the environment was not redacted at all."""
    from retry_engine.delta._log import TableLocation
    from retry_engine.errors import DeltaSourceError, StorageError
    from retry_engine.ops.monitor import TERMINATED, lifecycle_row

    monkeypatch.setenv("AWS_SESSION_TOKEN", "SEKRET-TOKEN-from-env-123")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SEKRET-KEY-from-env-456")
    assert storage.scrubbed(_EXPIRED + " and SEKRET-KEY-from-env-456") == (
        "Generic S3 error: Error performing GET in 2ms\n  ↳ Server returned non-2xx status code: 400 Bad Request: "
        "ExpiredToken: The provided token has expired. and ***"
    )
    with pytest.raises(StorageError) as caught, storage.reaching("s3://b/t"):
        raise OSError(_EXPIRED)
    assert "SEKRET" not in str(caught.value) and "SEKRET" not in str(caught.value.__cause__)
    assert isinstance(caught.value.__cause__, OSError) and "ExpiredToken" in str(caught.value.__cause__)
    assert caught.value.code == "ACCESS_DENIED"

    class Unreadable(TableLocation):
        @property
        def table_uri(self) -> str:
            raise OSError(_EXPIRED)

    with pytest.raises(DeltaSourceError) as unreadable:
        Unreadable("s3://b/t").open_table()
    assert "SEKRET" not in str(unreadable.value) and unreadable.value.__suppress_context__
    row = lifecycle_row(TERMINATED, query_id="q", run_id="r", event_time=dt.datetime.now(dt.UTC),
                        recorded_at=dt.datetime.now(dt.UTC), exception=f"Traceback ...\nOSError: {_EXPIRED}")
    assert "SEKRET" not in row["exception"] and "ExpiredToken: The provided token has expired." in row["exception"]
    # Only credentials proper, and none short: LocalStack's documented "test" key pair and a flag's "true"
    # blanked bucket names and words ("s3://***-bucket", "the la*** con***"; the review of this fix).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    storage.register(f"s3://scrub-{uuid.uuid4().hex[:6]}/lake", {"aws_skip_signature": "true", "aws_access_key_id": "AKIDEXAMPLE1"})
    plain = "the latest test-bucket contest: aws_allow_http = true; AKIDEXAMPLE1"
    assert storage.scrubbed(plain) == plain
    # Azure's keys under every name object_store takes (the allow-list first missed four of six).
    monkeypatch.setenv("AZURE_STORAGE_ACCESS_KEY", "AZ-ENV-ACCESS-KEY-1")
    storage.register(f"az://scrub-{uuid.uuid4().hex[:6]}/lake", {
        "azure_storage_access_key": "AZ-ACCESS-KEY-2", "master_key": "AZ-MASTER-KEY-3", "access_key": "AZ-ACCESS-KEY-4",
        "azure_storage_master_key": "AZ-MASTER-KEY-5"})
    shown = storage.scrubbed("AZ-ENV-ACCESS-KEY-1 AZ-ACCESS-KEY-2 AZ-MASTER-KEY-3 AZ-ACCESS-KEY-4 AZ-MASTER-KEY-5")
    assert shown == "*** *** *** *** ***"
    # A text of many unclosed error tags is no slow match (it took 17 s): cut as it is.
    assert storage.scrubbed("<Error>" * 20_000) == "<Error>" * 20_000
