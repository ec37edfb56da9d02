"""What a ``retry-engine`` command imports before it does its work.

Every command builds every subcommand's parser. The parsers imported the modules
that do the work to get their choices and defaults (the DLQ client and its pandas,
the schema text and PySpark, the configuration models): ``retry-engine --help``
took 0.5-0.6 s of imports on this machine, and every command paid them. The
parsers now take their words from :mod:`retry_engine.ops.terms` and
:mod:`retry_engine.core.names`; these tests keep them light and keep those words
the same as the library's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import retry_engine.delta
from retry_engine.core import names
from retry_engine.ops import redrive, terms
from retry_engine.ops.cli import _parser
from retry_engine.schemas import ALL_TABLES, DLQ

HEAVY = ("pandas", "pyarrow", "pyspark", "pydantic", "deltalake", "numpy")

# Parse one command line of every subcommand in a new interpreter, then say what got imported.
PARSE_ALL = """
import json, sys
from retry_engine.ops.cli import _parser

parser = _parser()
lines = json.loads(sys.argv[1])
parsed = [sorted(k for k, v in vars(parser.parse_args(argv)).items() if v not in (None, False)) for argv in lines]
heavy = sorted(name for name in json.loads(sys.argv[2]) if name in sys.modules)
print(json.dumps({"parsed": len(parsed), "heavy": heavy}))
"""

EVERY_COMMAND = [
    ["run", "--once"],
    ["demo", "--messages", "3"],
    ["zip"],
    ["prepare", "--if-missing"],
    ["check-config", "--config", "x.toml"],
    ["dlq", "list", "--group", "G", "--since", "2026-11-22T12:00:00", "--limit", "5"],
    ["dlq", "show", "M1", "--format", "json"],
    ["dlq", "stats", "--by", "group,day"],
    ["dlq", "redrive", "--all", "--to", "retry", "--chunk-size", "10", "--dry-run"],
    ["dlq", "resolve", "--all", "--reason", "handled"],
    ["dlq", "purge", "--id", "M1", "--reason", "spam"],
    ["dlq", "expire", "--retention", "7d"],
    ["dlq", "resend", "M1", "--consumer-id", "c1"],
    ["redrive", "list", "--state", "running"],
    ["redrive", "status", "R1"],
    ["redrive", "cancel", "R1", "--reason", "wrong"],
    ["status", "--json"],
    ["plots", "--out", "charts"],
    ["schema", "dlq", "--format", "spark-ddl"],
    ["catalog-ddl", "--catalog", "c", "--schema", "s"],
    ["maintain", "--table", "retry", "--dry-run"],
]


def test_building_and_parsing_every_command_imports_no_data_library() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PARSE_ALL, json.dumps(EVERY_COMMAND), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"parsed": len(EVERY_COMMAND), "heavy": []}


def test_every_subcommand_is_in_the_import_check() -> None:
    """A new subcommand joins EVERY_COMMAND, so its parser's imports are checked too."""
    sub = next(a for a in _parser()._actions if a.dest == "command")
    assert sorted(sub.choices) == sorted({argv[0] for argv in EVERY_COMMAND})  # type: ignore[arg-type]


def test_the_parsers_words_name_what_the_library_has() -> None:
    """The light lists are second copies of what the library defines: they must name the same things."""
    assert sorted(names.TABLE_NAMES) == sorted(t.name for t in ALL_TABLES)  # the schemas' tables, by name
    assert set(names.MAINTAINED_TABLES) <= set(names.TABLE_NAMES)
    # `dlq stats` with no --by counts by keys the summary knows, each a DLQ column (or the derived day).
    by = _parser().parse_args(["dlq", "stats"]).by.split(",")
    assert by and set(by) <= set(terms.SUMMARY_KEYS)
    assert set(terms.SUMMARY_KEYS.values()) - {"day"} <= set(DLQ.names)
    # Every `dlq redrive --to` has a table to move to.
    assert set(terms.REDRIVE_TARGETS) <= set(redrive.TARGET_TABLES)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["schema", "nope"], "invalid choice: 'nope'"),
        (["schema", "--format", "yaml"], "invalid choice: 'yaml'"),
        (["maintain", "--table", "_engine_state"], "invalid choice: '_engine_state'"),
        (["dlq", "redrive", "--to", "consumer"], "invalid choice: 'consumer'"),
        (["dlq", "redrive", "--chunk-size", "0"], "0 must be at least 1"),
        (["dlq", "list", "--since", "yesterday"], "is not an ISO 8601 time"),
        (["redrive", "list", "--state", "done"], "invalid choice: 'done'"),
        (["dlq", "list", "--format", "xml"], "invalid choice: 'xml'"),
    ],
)
def test_the_light_parsers_still_refuse_bad_arguments(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_the_delta_package_names_load_on_first_use() -> None:
    for name in retry_engine.delta.__all__:
        assert getattr(retry_engine.delta, name) is not None
    assert retry_engine.delta.FORMAT_NAME == "deltars"
    # Before any is loaded (a new interpreter), dir() lists them all: a notebook's tab completion.
    listed = subprocess.run(
        [sys.executable, "-c", "import retry_engine.delta as d, sys; print(sorted(set(d.__all__) - set(dir(d))), "
         "'pyspark' in sys.modules)"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    assert listed == ["[]", "False"]
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        retry_engine.delta.nope  # noqa: B018
