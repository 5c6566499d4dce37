"""``bayesurl train`` options resolve through the recipe road's overrides, to the same config.

``train_flag_configs.json`` holds ``RunConfig.to_dict()`` of each invocation as the command
built it by hand, field by field, before its options became overrides; the resolved config
must stay equal to it (types included: ``1`` and ``1.0`` differ in JSON text).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bayesurl.cli import build_parser, main
from bayesurl.commands import train
from bayesurl.runs import load_recipe
from bayesurl.runs.config import resolve_tables

FROZEN = json.loads((Path(__file__).parent / "train_flag_configs.json").read_text())


def _config(tmp_path, *argv):
    args = build_parser().parse_args(["train", *argv, "--out", str(tmp_path / "o")])
    return train.build_config(args)


@pytest.mark.parametrize("case", sorted(FROZEN))
def test_options_resolve_to_the_config_built_by_hand(tmp_path, case):
    cfg = _config(tmp_path, *FROZEN[case]["argv"])
    got = json.dumps(cfg.to_dict(), sort_keys=True)
    assert got == json.dumps(FROZEN[case]["config"], sort_keys=True)


def test_every_option_is_a_config_key_or_steers_the_command():
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices["train"]
    dests = {a.dest for a in sub._actions if a.option_strings} - {"help", "debug"}
    assert dests == set(train.FLAG_KEYS) | set(train.RUN_OPTIONS)
    assert not set(train.FLAG_KEYS) & set(train.RUN_OPTIONS)


def test_set_applies_after_the_options_and_before_device(tmp_path):
    cfg = _config(
        tmp_path,
        *["--method", "ce", "--epochs", "3", "--set", "train.epochs=4"],
        *["--set", "eval.samples=2", "--set", "backbone.kwargs={width = 8}"],
        *["--set", "device=meta", "--device", "cpu"],
    )
    assert cfg.train.epochs == 4 and cfg.eval.samples == 2
    assert cfg.backbone.kwargs == {"width": 8} and cfg.device == "cpu"
    # the rest is the options' config
    base = _config(tmp_path, "--method", "ce", "--device", "cpu")
    assert (cfg.train.optimizer, cfg.train.warmup_epochs) == (base.train.optimizer, 1.0)
    # a method option given both ways: --set wins, the others stay
    cfg = _config(
        tmp_path,
        *["--method", "ce", "--method-arg", "a=1", "--method-arg", "b=2"],
        *["--set", "estimator.kwargs.b=3"],
    )
    assert cfg.estimator.kwargs == {"a": 1, "b": 3}


def test_the_options_meet_the_recipe_road_checks_naming_the_option(tmp_path):
    for argv, message in (
        (["--lr", "-1"], "`--lr` must be a positive number, got -1.0"),
        (["--warmup-epochs", "-0.5"], "`--warmup-epochs` must be >= 0"),
        (["--optimizer", "adagrad"], "unknown `--optimizer` 'adagrad'; valid: adam, adamw"),
        (["--amp", "fp8"], "unknown `--amp` 'fp8'"),
        (["--num-workers", "-1"], "`--num-workers` must be >= 0"),
        (["--seed", "-2"], "`--seed` must be >= 0, got -2"),
        (["--batch-size", "0"], "`--batch-size` must be >= 1, got 0"),
        (["--grad-accum", "0"], "`--grad-accum` must be >= 1, got 0"),
        (["--embed-dim", "0"], "`--embed-dim` must be >= 1"),
        (["--subset", "0"], "`--subset` must be >= 1, got 0"),
        (["--dataset", "cars", "--root", "x", "--image-size", "4"], "`--image-size` must be >= 8"),
    ):
        with pytest.raises(ValueError) as info:
            _config(tmp_path, "--method", "ce", *argv)
        assert message in str(info.value), (argv, str(info.value))
    # a key given with --set keeps its own name
    with pytest.raises(ValueError, match=r"^`train\.epochs` must be >= 1, got 0$"):
        _config(tmp_path, "--method", "ce", "--set", "train.epochs=0")
    with pytest.raises(ValueError, match="unknown key `train.epoch`; valid keys of"):
        _config(tmp_path, "--method", "ce", "--set", "train.epoch=3")


def test_preset_without_a_recipe_is_refused_not_ignored(tmp_path, capsys):
    assert main(["train", "--method", "ce", "--preset", "smoke", "--out", str(tmp_path)]) == 2
    assert "`--preset` is a preset of a recipe file" in capsys.readouterr().err


def test_recipe_road_keeps_its_config(tmp_path):
    cfg = _config(tmp_path, "--recipe", "fashion_mnist/ce", "--preset", "smoke", "--device", "cpu")
    want = load_recipe("fashion_mnist/ce", [("device", "cpu")], preset="smoke")
    assert cfg == want and cfg.train.epochs == want.train.epochs


@pytest.mark.parametrize(
    ("argv", "flag", "key"),
    [
        (["--epochs", "3"], "--epochs", "train.epochs"),
        (["--method", "elk"], "--method", "estimator.name"),
        (["--method-arg", "lam=0.5"], "--method-arg", "estimator.kwargs"),
    ],
)
def test_an_option_beside_a_recipe_is_refused_not_ignored(tmp_path, argv, flag, key):
    with pytest.raises(ValueError, match=f"`{flag}` has no effect with `--recipe`.*{key}"):
        _config(tmp_path, "--recipe", "fashion_mnist/ce", *argv)
    # an option left at its default is no conflict
    _config(tmp_path, "--recipe", "fashion_mnist/ce", "--epochs", "5")


def test_resolve_tables_reads_none_as_toml_does_unless_told_not_to():
    tables = {"estimator": {"name": "sngp", "kwargs": {"spectral_norm": "none"}}}
    assert resolve_tables(tables, dataset="d").estimator.kwargs == {"spectral_norm": None}
    kept = resolve_tables(tables, [("backbone.checkpoint", "none")], dataset="d", toml_none=False)
    assert kept.estimator.kwargs == {"spectral_norm": "none"} and kept.backbone.checkpoint == "none"
    assert tables["estimator"]["kwargs"] == {"spectral_norm": "none"}  # not modified
    cfg = resolve_tables({"train": {"epochs": 3}, "seed": 1}, ["train.epochs=4"], dataset="d")
    assert (cfg.train.epochs, cfg.seed, cfg.train.optimizer) == (4, 1, "adamw")
    with pytest.raises(ValueError, match="unknown section `trian`"):
        resolve_tables({}, ["trian.epochs=1"], dataset="d")
