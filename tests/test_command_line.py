"""The `bayesurl` command: every subcommand has --help, unknown commands fail."""

import subprocess
import sys

import pytest

from bayesurl.cli import _subcommands, build_parser, main

EXPECTED = {"benchmark", "evaluate", "run", "train", "wrap"}


def test_expected_subcommands_exist():
    assert EXPECTED <= set(_subcommands())


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: bayesurl {name}" in out


def test_unknown_subcommand_fails(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code != 0
    assert "invalid choice" in capsys.readouterr().err


def test_console_entry_point_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "bayesurl", "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and "COMMAND" in proc.stdout
    assert build_parser().prog == "bayesurl"
