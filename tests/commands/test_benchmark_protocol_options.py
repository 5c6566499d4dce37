"""``bayesurl benchmark``'s stored-sweep options: the preset's plan, notices, argument errors."""

from __future__ import annotations

import sys

import pytest

from bayesurl.cli import build_parser, main
from bayesurl.commands.benchmark import DEFAULT_OUT, sweep_options
from bayesurl.runs.config import DEFAULT_RECIPE_FILE
from bayesurl.sweeps.options import FLAGS, SweepOptions
from bayesurl.sweeps.plan import SweepPreset, smoke_notice, sweep_preset
from bayesurl.sweeps.sweep import resolve_preset

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


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
    # another recipe file: the command it names runs that file, not the default one
    note = smoke_notice(sweep_preset("clipart", "smoke"), "clipart")
    assert "`bayesurl benchmark --dataset clipart --preset pretrained`" in note
    with pytest.raises(ValueError, match="verdict"):
        SweepPreset("x", verdict="")


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--preset", "standard", "--tune", "-1"], "--tune"),
        (["--worker", "--tune", "2"], "--tune"),
        (["--tune-only"], "--tune-only"),
        (["--preset", "standard", "--threads", "0"], "--threads"),
        (["--preset", "standard", "--heartbeat", "0"], "--heartbeat"),
        (["--preset", "standard", "--poll", "0"], "--poll"),
    ],
)
def test_bad_protocol_arguments(argv, match, capsys):
    assert main(["benchmark", *argv]) == 2
    assert match in capsys.readouterr().err


def test_tune_only_searches_writes_the_recipe_table_and_runs_nothing(tmp_path, capsys):
    """The smoke preset end to end: CE and PVU (its wrapper rate, on CE's choice) are tuned,
    the free baseline runs no trial, nothing is planned."""
    out = tmp_path / "tune"
    argv = ["benchmark", "--preset", "smoke", "--methods", "pvu,feature_norm,ce", "--tune",
            "2", "--tune-only", "--out", str(out), "--storage", f"sqlite:///{tmp_path}/t.db",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    # smoke: the standard split 0-4 -> 5-9, validation classes 0, 4 (trained on 1-3)
    assert "[presets.smoke.tuned.val_0_4]" in text
    assert "tune feature_norm: nothing to tune" in text
    assert f"written to {out / 'tuned.json'} and {out / 'tuned.toml'}" in text
    table = tomllib.loads((out / "tuned.toml").read_text())["presets"]["smoke"]["tuned"]
    table = table["val_0_4"]
    assert table.pop("tuned_on") == [0, 4] and table.pop("trained_on") == [1, 2, 3]
    assert set(table) == {"ce", "pvu"}
    assert table["ce"][0].startswith("train.lr=")
    assert table["pvu"][0].startswith("estimator.fit.lr=")
    assert not (out / "results.json").exists() and not (out / "partial_runs.json").exists()


def test_benchmark_flags_are_generated_from_the_sweep_options_fields(tmp_path):
    """Each field that declares a flag has it, with the field's default; the flags set the
    fields they name and an error names the flag as typed."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    flags = {s: a.dest for a in sub.choices["benchmark"]._actions for s in a.option_strings}
    assert {flags[f] for f in FLAGS.values()} == set(FLAGS)
    assert len(FLAGS) == 17 and SweepOptions().dataset == DEFAULT_RECIPE_FILE
    plain = sweep_options(_args())
    assert plain == SweepOptions(default_out=DEFAULT_OUT)
    root = str(tmp_path)
    given = sweep_options(
        _args("--splits", "3", "--untuned", "--no-progress", "--heartbeat", "5", "--poll", "0.5",
              "--set", "train.epochs=2", "--seeds", "0,2", "--root", root, "--tune", "2",
              "--tune-split", "1", "--save-checkpoints", "--preset", "smoke")
    )  # fmt: skip
    assert (given.splits, given.recipe_tuned, given.progress) == (3, False, False)
    assert (given.heartbeat_interval, given.poll, given.tune, given.tune_split) == (5, 0.5, 2, 1)
    assert given.overrides == ("train.epochs=2", ("data.root", root))
    assert list(given.seeds) == [0, 2] and given.save_checkpoints and given.preset == "smoke"
    for argv, needle in (
        (["--heartbeat", "0"], "`--heartbeat`"),
        (["--tune-only"], "`--tune-only` needs `--tune`"),
        (["--seeds", "0,,1"], "empty entry"),
        (["--set", "train.epochs"], "`--set`"),
    ):
        with pytest.raises(ValueError, match=needle):
            sweep_options(_args(*argv))
