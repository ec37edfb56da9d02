"""#13 part 6 (documentation bits): help in plain words, documented Spark settings, error class spellings."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from retry_engine.clients.consumer import _qualified
from retry_engine.config import load_config, parse_config
from retry_engine.delta.session import spark_conf
from retry_engine.errors import ConfigError
from retry_engine.ops.cli import _parser
from tests.builders import Result
from tests.unit.test_decide import run

REPO = Path(__file__).resolve().parents[2]
SPEC_CODE = re.compile(r"\b[RB]\d+\b")


def _parsers(parser: argparse.ArgumentParser, name: str = "retry-engine") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child_name, child in action.choices.items():
                yield from _parsers(child, f"{name} {child_name}")


def test_no_help_text_speaks_in_spec_codes() -> None:
    """#13 part 6: `--help` of every (sub)command speaks plain words, not the spec's R1/B6 codes."""
    seen = []
    for name, parser in _parsers(_parser()):
        seen.append(name)
        found = SPEC_CODE.findall(parser.format_help())
        assert not found, f"{name} --help mentions {found}"
    assert {"retry-engine dlq", "retry-engine dlq show", "retry-engine dlq redrive", "retry-engine status"} <= set(seen)


class LocalError(Exception):
    """A class defined outside builtins: the consumer records it with its module."""


@pytest.mark.parametrize(
    ("configured", "raised", "outcome"),
    [
        ("ValueError", ValueError, "dead_letter"),
        ("builtins.ValueError", ValueError, "dead_letter"),  # silently never matched before #13
        ("KeyError", ValueError, "retry"),
        (f"{__name__}.LocalError", LocalError, "dead_letter"),
        ("LocalError", LocalError, "retry"),  # a non-builtin needs its module
    ],
)
def test_error_classes_accept_both_spellings_of_builtins(configured: str, raised: type, outcome: str) -> None:
    """Non-retryable error classes: the consumer's own spelling of the raised class decides (#13 part 6)."""
    cfg = {"groups": {"G": {"non_retryable": {"error_classes": [configured]}}}}
    (row,) = run([Result.of().with_(status="EXCEPTION", error_class=_qualified(raised))], cfg)
    assert row["outcome"] == outcome
    if outcome == "dead_letter":
        assert row["reason_code"] == "NON_RETRYABLE"


def test_error_class_column_spelled_with_builtins_matches_too() -> None:
    """A producer other than the Consumer may write ``builtins.ValueError`` in the table: same class."""
    cfg = {"groups": {"G": {"non_retryable": {"error_classes": ["ValueError", "__main__.Boom"]}}}}
    rows = run(
        [
            Result.of().with_(status="EXCEPTION", error_class="builtins.ValueError"),
            Result.of().with_(status="EXCEPTION", error_class="Boom"),
            Result.of().with_(status="EXCEPTION", error_class="builtins."),
            Result.of().with_(status="EXCEPTION", error_class="notbuiltins.ValueError"),
        ],
        cfg,
    )
    assert [r["outcome"] for r in rows] == ["dead_letter", "dead_letter", "retry", "retry"]


def test_an_empty_error_class_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"an error class is empty"):
        parse_config({"groups": {"G": {"non_retryable": {"error_classes": ["ValueError", " "]}}}})


def _readme_toml_blocks() -> list[str]:
    return re.findall(r"```toml\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)


def test_readme_spark_ui_setting_turns_the_ui_on(tmp_path: Path) -> None:
    """#13 part 6: the README's engine.spark_conf example is valid config and enables the UI the engine turns off."""
    (block,) = [b for b in _readme_toml_blocks() if "spark.ui.enabled" in b]
    conf = tmp_path / "c.toml"
    conf.write_text(block)
    extra = load_config(conf, env={}).engine.spark_conf
    assert spark_conf()["spark.ui.enabled"] == "false"
    assert spark_conf(extra=extra)["spark.ui.enabled"] == "true" and spark_conf(extra=extra)["spark.ui.port"] == "4040"


def test_readme_non_retryable_example_is_valid_config(tmp_path: Path) -> None:
    (block,) = [b for b in _readme_toml_blocks() if "non_retryable" in b]
    conf = tmp_path / "c.toml"
    conf.write_text(block)
    group = load_config(conf, env={}).group("billing")
    assert group is not None and group.non_retryable.error_classes == ["ValueError", "myapp.errors.InvalidOrder"]


def test_spark_settings_written_as_toml_numbers_and_booleans_are_spark_strings(tmp_path: Path) -> None:
    """A user writes `"spark.ui.port" = 4040` and `"spark.ui.enabled" = true` (TOML's own types): they were
    refused ("Input should be a valid string"); Spark's own builder turns them into "4040" and "true"."""
    conf = tmp_path / "c.toml"
    conf.write_text(
        '[engine.spark_conf]\n"spark.ui.port" = 4040\n"spark.ui.enabled" = true\n"spark.memory.fraction" = 0.5\n'
    )
    extra = load_config(conf, env={}).engine.spark_conf
    assert extra == {"spark.ui.port": "4040", "spark.ui.enabled": "true", "spark.memory.fraction": "0.5"}
    assert spark_conf(extra=extra)["spark.ui.enabled"] == "true"


@pytest.mark.parametrize("table", ['"" = "x"', '" " = "x"', '"spark.x" = [1]', '"spark.x" = { a = 1 }'])
def test_spark_settings_without_a_name_or_with_a_list_or_table_value_are_refused(tmp_path: Path, table: str) -> None:
    from retry_engine.errors import ConfigError

    conf = tmp_path / "c.toml"
    conf.write_text(f"[engine.spark_conf]\n{table}\n")
    with pytest.raises(ConfigError, match="engine.spark_conf"):
        load_config(conf, env={})
