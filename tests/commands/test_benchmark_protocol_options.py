"""``bayesurl benchmark``'s protocol options: dispatch, notices, argument errors."""

from __future__ import annotations

import pytest

from bayesurl.cli import build_parser, main
from bayesurl.commands._protocol import smoke_notice, wants_protocol


def _args(*argv):
    return build_parser().parse_args(["benchmark", *argv])


def test_dispatch_to_the_protocol():
    assert wants_protocol(_args("--preset", "standard"))
    assert wants_protocol(_args("--worker"))
    assert wants_protocol(_args("--storage", "sqlite:///x.db"))
    assert wants_protocol(_args("--tune", "3"))
    assert not wants_protocol(_args("--preset", "quick"))
    assert not wants_protocol(_args("--preset", "smoke"))


def test_smoke_presets_print_how_to_get_the_real_run():
    for preset in ("quick", "smoke"):
        note = smoke_notice(preset)
        assert "smoke-scale" in note and "--preset standard" in note
    assert smoke_notice("standard") is None


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--preset", "standard", "--tune", "-1"], "--tune"),
        (["--worker", "--tune", "2"], "--tune"),
        (["--preset", "standard", "--threads", "0"], "--threads"),
    ],
)
def test_bad_protocol_arguments(argv, match, capsys):
    assert main(["benchmark", *argv]) == 2
    assert match in capsys.readouterr().err
