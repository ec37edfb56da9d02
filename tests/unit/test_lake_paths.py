"""#13 part 4: lake paths that do not surprise.

Relative paths in a config file mean the file's folder, not the working
directory; ``--lake`` overrides the lake on every command that reads a config;
a command that reads a lake that is not there exits 2 and says where it looked
(instead of "no dead letters", exit 0). No Spark: ``run`` refuses a bad lake
before it builds a session.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from retry_engine.config import ENV_LAKE, load_config
from retry_engine.errors import LakeNotFoundError
from retry_engine.ops.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, _parser, main
from retry_engine.schemas import DLQ

REPO = Path(__file__).resolve().parents[2]
READING_COMMANDS = (
    ["status"],
    ["plots", "--out", "png"],
    ["dlq", "list"],
    ["dlq", "show", "SOME-ID"],
    ["dlq", "stats"],
    ["dlq", "redrive", "--all", "--to", "topic", "--dry-run"],
)


@pytest.fixture(autouse=True)
def _no_lake_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every test runs in its own empty working directory without RETRY_ENGINE_* set."""
    for var in ("RETRY_ENGINE_LAKE", "RETRY_ENGINE_CHECKPOINT", "RETRY_ENGINE_MASTER"):
        monkeypatch.delenv(var, raising=False)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)


def _dlq_lake(path: Path) -> Path:
    """A lake holding one (empty) engine table: the DLQ."""
    write_deltalake(str(path / "dlq"), DLQ.arrow_schema.empty_table(), partition_by=list(DLQ.partition_by))
    return path


# -- relative paths in the file ------------------------------------------------------


def test_relative_paths_in_a_config_file_are_relative_to_its_folder(tmp_path: Path) -> None:
    """#13 part 4: lake, checkpoint and [tables] paths from a file do not depend on the working directory."""
    conf = tmp_path / "conf" / "engine.toml"
    conf.parent.mkdir()
    conf.write_text(
        '[engine]\nlake = "../my lake"\ncheckpoint = "ck"\n[tables]\ndlq = "./other/dlq"\nretry = "s3://bucket/retry"\n'
    )
    config = load_config(conf, env={})
    assert config.table_path("outcomes") == str(tmp_path / "my lake" / "outcomes")
    assert config.checkpoint_path == str(tmp_path / "conf" / "ck")
    assert config.table_path("dlq") == str(tmp_path / "conf" / "other" / "dlq")
    assert config.table_path("retry") == "s3://bucket/retry"  # a URI is never joined to a folder
    # Given relative to the working directory, the file means the same.
    os.chdir(tmp_path)
    assert load_config("conf/engine.toml", env={}).table_path("outcomes") == str(tmp_path / "my lake" / "outcomes")


def test_the_shipped_config_file_points_at_the_repositorys_data_lake_from_anywhere() -> None:
    """#13 part 4: `make run`'s tables stay in <repo>/data/lake; run from another folder, the file still means them."""
    config = load_config(REPO / "conf" / "retry-engine.toml", env={})
    assert config.table_path("dlq") == str(REPO / "data" / "lake" / "dlq")


def test_tilde_and_uris_in_a_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    conf = tmp_path / "c.toml"
    conf.write_text('[engine]\nlake = "~/lakes/main"\n')
    assert load_config(conf, env={}).engine.lake == str(tmp_path / "home" / "lakes" / "main")
    conf.write_text('[engine]\nlake = "s3://bucket/lake"\n')
    assert load_config(conf, env={}).table_path("dlq") == "s3://bucket/lake/dlq"
    conf.write_text('[engine]\nlake = "file:///srv/lake"\n')
    assert load_config(conf, env={}).engine.lake == "file:///srv/lake"


def test_without_a_file_the_default_and_the_environment_are_relative_to_the_working_directory() -> None:
    """#13 part 4: the embedded default (no config file) keeps resolving against the working directory."""
    assert not Path("conf/retry-engine.toml").exists()
    assert os.path.abspath(load_config(env={}).table_path("dlq")) == os.path.abspath("data/lake/dlq")
    assert os.path.abspath(load_config(env={ENV_LAKE: "rel"}).table_path("dlq")) == os.path.abspath("rel/dlq")


def test_an_empty_lake_in_a_file_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A blank lake would put every table in some folder under its bare name: refused, not resolved."""
    conf = tmp_path / "c.toml"
    conf.write_text('[engine]\nlake = " "\n')
    assert main(["check-config", "--config", str(conf)]) == EXIT_ERROR
    assert "[INVALID_CONFIG]" in (err := capsys.readouterr().err) and "engine.lake: Value error, lake is empty" in err


# -- --lake ---------------------------------------------------------------------------


def _commands_with(parser: argparse.ArgumentParser, option: str, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found = {prefix} if any(option in a.option_strings for a in parser._actions) else set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found |= _commands_with(child, option, (*prefix, name))
    return found


def test_every_command_that_takes_a_config_takes_lake() -> None:
    """#13 part 4: --lake on every command that reads or writes a lake."""
    parser = _parser()
    with_config = _commands_with(parser, "--config")
    assert {("run",), ("status",), ("plots",), ("check-config",), ("dlq", "list"), ("dlq", "redrive")} <= with_config
    assert with_config <= _commands_with(parser, "--lake")


def test_lake_overrides_the_file_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('[engine]\nlake = "from-file"\n')
    monkeypatch.setenv(ENV_LAKE, str(tmp_path / "from-env"))
    assert main(["check-config", "--config", str(conf), "--lake", str(tmp_path / "from flag")]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"{tmp_path}/from flag/dlq" in out and f"{tmp_path}/from flag/_checkpoints/engine" in out
    assert "from-env" not in out and "from-file" not in out


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_lake_flag_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["dlq", "list", "--lake", value])
    assert exit_info.value.code == EXIT_USAGE
    assert "the lake path is empty" in capsys.readouterr().err


def test_lake_flag_with_spaces_and_tilde(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lake path with spaces works as given; ``--lake=~/x`` (no shell expansion) is the home folder's x."""
    spaced = _dlq_lake(tmp_path / "a lake with spaces")
    assert main(["dlq", "list", "--lake", str(spaced)]) == EXIT_OK
    assert "no dead letters match" in capsys.readouterr().err
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["dlq", "list", "--lake=~/a lake with spaces"]) == EXIT_OK
    assert "no dead letters match" in capsys.readouterr().err
    # Relative to the working directory.
    os.chdir(tmp_path)
    assert main(["dlq", "stats", "--lake", "a lake with spaces"]) == EXIT_OK


# -- a lake that is not there -------------------------------------------------------------


@pytest.mark.parametrize("command", READING_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_command_reading_a_missing_lake_exits_2_and_says_where_it_looked(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#13 part 4: not "no dead letters" and exit 0 on a lake that does not exist."""
    missing = tmp_path / "no such lake"
    assert main([*command, "--lake", str(missing)]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert "[LAKE_NOT_FOUND]" in captured.err and f"no lake at {missing}: it does not exist" in captured.err
    assert f"{missing}" in captured.err and "--lake" in captured.err
    assert "no dead letters" not in captured.err + captured.out


def test_a_missing_lake_from_a_config_file_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "conf" / "c.toml"
    conf.parent.mkdir()
    conf.write_text('[engine]\nlake = "../lake"\n')
    assert main(["dlq", "list", "--config", str(conf)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"no lake at {tmp_path / 'lake'}" in err
    assert f"engine.lake = '../lake' in {conf}, relative to that file's folder" in err


def test_a_file_is_not_a_lake(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    not_a_folder = tmp_path / "lake.txt"
    not_a_folder.write_text("hello")
    assert main(["dlq", "list", "--lake", str(not_a_folder)]) == EXIT_USAGE
    assert f"no lake at {not_a_folder}: it is a file, not a folder" in capsys.readouterr().err
    # run creates a missing lake, but refuses a file before it starts Spark.
    assert main(["run", "--lake", str(not_a_folder)]) == EXIT_USAGE
    assert f"[LAKE_NOT_A_FOLDER] the lake {not_a_folder} is a file, not a folder" in capsys.readouterr().err


def test_a_folder_without_engine_tables_is_not_a_lake(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["status", "--lake", str(tmp_path / "empty")]) == EXIT_USAGE
    assert f"no lake at {tmp_path / 'empty'}: it holds no engine table" in capsys.readouterr().err


# -- a config written for releases that read it from the working directory ---------------


def _config_beside_an_old_lake(tmp_path: Path, lake: str = "./data/lake") -> tuple[Path, Path]:
    """conf/c.toml with a relative engine.lake, run from a folder whose ./data/lake holds the lake an
    earlier release (paths from the working directory) ran on; nothing at conf/data/lake."""
    conf = tmp_path / "elsewhere" / "conf" / "c.toml"
    conf.parent.mkdir()
    conf.write_text(f'[engine]\nlake = "{lake}"\n')
    old = tmp_path / "elsewhere" / "data" / "lake"
    old.mkdir(parents=True)
    return conf, _dlq_lake(old)


def test_run_refuses_to_start_a_new_lake_beside_the_one_an_earlier_release_ran_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The upgrade trap: `run --config conf/c.toml` from the same folder as before would have created
    an empty lake at conf/data/lake and run on nothing while the real one (and its waiting retries)
    stayed at ./data/lake. Refused before Spark starts, naming both places and the three ways on."""
    conf, old = _config_beside_an_old_lake(tmp_path)
    assert main(["run", "--config", "conf/c.toml"]) == EXIT_USAGE
    err = capsys.readouterr().err
    new = conf.parent / "data" / "lake"
    assert f"[LAKE_PATH_MOVED] no lake at {new} (from engine.lake = './data/lake' in conf/c.toml" in err
    assert f"but {old} holds one" in err and f"--lake {old}" in err and f"--lake {new}" in err
    assert not new.exists()


@pytest.mark.parametrize(
    "how",
    ["the lake is where the file says", "--lake", "RETRY_ENGINE_LAKE", "an absolute engine.lake", "a URI", "no old lake"],
)
def test_the_moved_lake_check_stays_out_of_the_way(tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the trap is refused: the lake at the file's place, an explicit --lake or environment
    lake, a path that means the same anywhere, or nothing at the old place all pass `run`'s check."""
    from retry_engine.delta.lake import require_lake_folder
    from retry_engine.ops.cli import _config, _file_lake_read_before, _lake_origin

    lake = {"an absolute engine.lake": str(tmp_path / "abs"), "a URI": "s3://bucket/lake"}.get(how, "./data/lake")
    conf, old = _config_beside_an_old_lake(tmp_path, lake)
    argv = ["run", "--config", "conf/c.toml"]
    if how == "the lake is where the file says":
        _dlq_lake(conf.parent / "data" / "lake")
    elif how == "--lake":
        argv += ["--lake", str(tmp_path / "new")]
    elif how == "RETRY_ENGINE_LAKE":
        monkeypatch.setenv(ENV_LAKE, str(tmp_path / "new"))
    elif how == "no old lake":
        (old / "dlq" / "_delta_log").rename(old / "not_a_log")
    args = _parser().parse_args(argv)
    require_lake_folder(_config(args), origin=_lake_origin(args), read_before=_file_lake_read_before(args))
    # ... and the trap itself through the same three calls:
    trap = _parser().parse_args(["run", "--config", "conf/c.toml"])
    if how in ("--lake", "RETRY_ENGINE_LAKE"):
        monkeypatch.delenv(ENV_LAKE, raising=False)
        with pytest.raises(LakeNotFoundError, match="LAKE_PATH_MOVED"):
            require_lake_folder(_config(trap), origin=_lake_origin(trap), read_before=_file_lake_read_before(trap))


@pytest.mark.parametrize("command", [["dlq", "list"], ["dlq", "stats"], ["status"], ["maintain", "--dry-run"]])
def test_a_damaged_commit_of_a_lake_table_is_one_line_not_a_backtrace(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hostile input (a table another writer damaged): delta-rs's error, whose text runs on with a Rust
    backtrace, is one line naming the table's problem and exit 1."""
    lake = _dlq_lake(tmp_path / "lake")
    write_deltalake(str(lake / "dlq"), DLQ.arrow_schema.empty_table(), mode="append")
    (lake / "dlq" / "_delta_log" / f"{1:020d}.json").write_text('{"add": 5}\n')
    assert main([*command, "--lake", str(lake)]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("retry-engine: [DELTA_TABLE_UNREADABLE] a table of the lake cannot be read: ")
    assert err.count("\n") == 1 and "expected {" in err


def _loose_dlq_row(**values: object) -> pa.Table:
    row = {**dict.fromkeys(DLQ.names), "msg_id": "m1", "topic": "%DLQ%G", "consumer_group": "G", "retry_topic": "t",
           "dead_lettered_at": dt.datetime(2026, 11, 1, tzinfo=dt.UTC), **values}
    return pa.Table.from_pylist([row], schema=pa.schema([f.with_nullable(True) for f in DLQ.arrow_schema]))


@pytest.mark.parametrize(
    ("command", "damage", "message"),
    [
        (["dlq", "list"], "dlq", "[SCHEMA_MISMATCH] table dlq at "),
        (["dlq", "stats"], "dlq", "has no column 'msg_id' (it has ['x']): another writer replaced or rewrote it"),
        (["redrive", "list"], "redrive_audit", "[SCHEMA_MISMATCH] table redrive_audit at "),
        (["dlq", "list"], "redrive_audit", "has no column 'redrive_id'"),
        (["redrive", "list"], "redrive_tasks", "[SCHEMA_MISMATCH] table redrive_tasks at "),
        (["dlq", "list"], "null msg_id", "[NULL_IN_REQUIRED_COLUMN] the DLQ table at "),
        (["dlq", "stats"], "null msg_id", "holds 1 row(s) without 'msg_id'"),
    ],
)
def test_a_table_another_writer_replaced_or_filled_with_nulls_is_named(
    command: list[str], damage: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hostile input (tables written by others): a DLQ, audit or task table replaced by another schema,
    or a dead letter without a msg id, is one error naming the table and the column (a KeyError, an
    ArrowInvalid or a cast's ValueError before)."""
    lake = tmp_path / "lake"
    if damage == "null msg_id":
        write_deltalake(str(lake / "dlq"), _loose_dlq_row(msg_id=None))
    else:
        _dlq_lake(lake)
        if damage == "dlq":
            shutil.rmtree(lake / "dlq")
        write_deltalake(str(lake / damage), pa.table({"x": [1]}))
    assert main([*command, "--lake", str(lake)]) == EXIT_ERROR
    assert message in capsys.readouterr().err


def test_plots_out_a_file_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Hostile CLI input: `plots --out` at a file (or below one) is one line, exit 1 (FileExistsError /
    NotADirectoryError tracebacks before)."""
    lake = _dlq_lake(tmp_path / "lake")
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        assert main(["plots", "--lake", str(lake), "--out", str(out)]) == EXIT_ERROR
        assert f"[INVALID_ARGUMENT] --out {out} is a file, or inside one" in capsys.readouterr().err
