"""``retry-engine catalog-ddl`` without Spark: quoting, escaping and locations (#13 part 5).

That Spark's parser reads the statements back is tested in tests/integration/test_catalog_ddl.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from retry_engine.config import TABLE_NAMES, parse_config
from retry_engine.errors import ConfigError
from retry_engine.ops.catalog import catalog_ddl, quote_identifier, sql_string, table_location
from retry_engine.ops.cli import EXIT_ERROR, EXIT_OK, main


def test_identifiers_are_back_quoted_with_inner_back_quotes_doubled() -> None:
    assert quote_identifier("dlq") == "`dlq`"
    assert quote_identifier("a`b") == "`a``b`"
    assert quote_identifier("``") == "``````"
    assert quote_identifier("drop table x; --") == "`drop table x; --`"
    assert quote_identifier("é.ü") == "`é.ü`"


@pytest.mark.parametrize("bad", ["", "a\nb", "tab\there", "nul\x00"])
def test_empty_or_control_character_names_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"INVALID_IDENTIFIER.*schema .*non-empty name without control characters"):
        quote_identifier(bad, what="schema")


def test_string_literals_escape_backslash_and_quote() -> None:
    assert sql_string("file:/a") == "'file:/a'"
    assert sql_string("it's") == r"'it\'s'"
    assert sql_string("C:\\lake") == r"'C:\\lake'"
    assert sql_string("a\nb") == r"'a\nb'"
    with pytest.raises(ConfigError, match="INVALID_LOCATION"):
        sql_string("bell\x07")


def test_local_paths_become_absolute_file_uris_and_uris_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert table_location("lake/dlq") == f"file:{tmp_path}/lake/dlq"
    assert table_location("/x y/dlq") == "file:/x y/dlq"  # not percent-encoded: Hadoop reads it as is
    assert table_location("s3://bucket/lake/dlq") == "s3://bucket/lake/dlq"
    assert table_location("abfss://c@acct.dfs.core.windows.net/dlq") == "abfss://c@acct.dfs.core.windows.net/dlq"
    assert table_location("file:/already/uri") == "file:/already/uri"


def test_one_statement_per_table_with_catalog_schema_and_prefix(tmp_path: Path) -> None:
    config = parse_config({"engine": {"lake": str(tmp_path / "lake")}, "tables": {"dlq": "s3://b/dead"}})
    statements = catalog_ddl(config, catalog="main", schema="ops", table_prefix="re_")
    assert len(statements) == len(TABLE_NAMES)
    by_table = dict(zip(TABLE_NAMES, statements, strict=True))
    assert by_table["dlq"] == "CREATE TABLE IF NOT EXISTS `main`.`ops`.`re_dlq` USING DELTA LOCATION 's3://b/dead';"
    assert by_table["retry"] == (
        f"CREATE TABLE IF NOT EXISTS `main`.`ops`.`re_retry` USING DELTA LOCATION 'file:{tmp_path}/lake/retry';"
    )
    assert catalog_ddl(config)[0].startswith("CREATE TABLE IF NOT EXISTS `consume_results` USING DELTA")
    with pytest.raises(ConfigError, match="INVALID_IDENTIFIER.*catalog 'main' needs a schema"):
        catalog_ddl(config, catalog="main")


def test_cli_prints_the_statements(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake = tmp_path / "it's a lake"
    config = tmp_path / "retry-engine.toml"
    config.write_text(f"[engine]\nlake = '''{lake}'''\n")
    assert main(["catalog-ddl", "--config", str(config), "--schema", "ops"]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[TABLE_NAMES.index("dlq")] == (
        f"CREATE TABLE IF NOT EXISTS `ops`.`dlq` USING DELTA LOCATION 'file:{tmp_path}/it\\'s a lake{os.sep}dlq';"
    )
    assert main(["catalog-ddl", "--config", str(config), "--catalog", "main"]) == EXIT_ERROR
    assert "needs a schema" in capsys.readouterr().err
