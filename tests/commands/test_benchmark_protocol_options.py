"""``bayesurl benchmark``'s stored-sweep options: the preset's plan, notices, argument errors."""

from __future__ import annotations

import pytest

from bayesurl.cli import build_parser, main
from bayesurl.runs.plan import SweepPreset, smoke_notice, sweep_preset
from bayesurl.runs.sweep import resolve_preset


def _args(*argv):
    return build_parser().parse_args(["benchmark", *argv])


def test_the_preset_names_the_storage():
    """standard is stored; --storage / --worker store any preset; quick and smoke stay in memory."""
    plan = lambda name, stored=False: resolve_preset(  # noqa: E731
        "fashion_mnist", name, seeds=None, splits=None, stored=stored
    )
    assert plan("standard").stored and plan("standard").splits == 4
    assert plan("quick", stored=True).stored and plan("smoke", stored=True).stored
    assert not plan("quick").stored and not plan("smoke").stored
    assert plan("quick").splits == 0 and plan("quick").seeds == (0,)
    assert _args("--storage", "sqlite:///x.db").storage == "sqlite:///x.db"
    assert _args("--tune", "3").tune == 3 and _args("--worker").worker


def test_smoke_presets_print_how_to_get_the_real_run():
    for preset in ("quick", "smoke"):
        note = smoke_notice(sweep_preset("fashion_mnist", preset))
        assert "smoke-scale" in note and "--preset standard" in note
    assert smoke_notice(sweep_preset("fashion_mnist", "standard")) is None
    # the frozen-feature previews point at the pretrained protocol, not the from-scratch one
    for preset in ("pretrained_smoke", "pretrained_quick"):
        note = smoke_notice(sweep_preset("fashion_mnist", preset))
        assert "--preset pretrained`" in note and "--preset standard" not in note
    assert smoke_notice(sweep_preset("fashion_mnist", "pretrained")) is None
    with pytest.raises(ValueError, match="verdict"):
        SweepPreset("x", verdict="")


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
