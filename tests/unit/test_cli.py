from __future__ import annotations

from pathlib import Path

import pytest

from retry_engine.ops.cli import EXIT_ERROR, EXIT_OK, main


def test_check_config_prints_resolved_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text(f'[engine]\nlake = "{tmp_path}/lake"\n')
    assert main(["check-config", "--config", str(conf)]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"{tmp_path}/lake/redrive_audit" in out and f"{tmp_path}/lake/messages" in out
    assert f"{tmp_path}/lake/dlq" in out and f"{tmp_path}/lake/_checkpoints/engine" in out


def test_bad_config_is_a_clear_error_and_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('[engine]\nmessage_delay_level = "1s 2q"\n')
    assert main(["check-config", "--config", str(conf)]) == EXIT_ERROR
    assert "'2q'" in capsys.readouterr().err
    assert main(["check-config", "--config", str(tmp_path / "missing.toml")]) == EXIT_ERROR
    assert "CONFIG_NOT_FOUND" in capsys.readouterr().err
