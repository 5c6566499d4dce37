"""The shared validators of ``bayesurl._checks``: each names its argument."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from bayesurl._checks import (
    check_concentration,
    check_device,
    check_input_file,
    check_int,
    check_ints,
    check_number,
    check_output_dir,
    check_output_file,
)


@pytest.mark.parametrize("text", ["bogus", "cuda:x", "", "cpu:0:1"])
def test_check_device_rejects_unparsable_names(text):
    with pytest.raises(ValueError, match="`--device`"):
        check_device(text, "--device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("text", ["cuda", "cuda:0", "cuda:3"])
def test_check_device_rejects_cuda_without_cuda(text):
    with pytest.raises(ValueError, match="`device`.*CUDA is not available"):
        check_device(text)


def test_check_device_accepts_cpu_and_none():
    assert check_device("cpu", "d") == torch.device("cpu")
    assert check_device(torch.device("cpu"), "d") == torch.device("cpu")
    assert check_device(None, "d") is None
    with pytest.raises(TypeError, match="`d`"):
        check_device(3, "d")  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_check_device_rejects_a_cuda_index_beyond_the_count():  # pragma: no cover - GPU only
    n = torch.cuda.device_count()
    assert check_device("cuda:0", "d") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match=f"only {n} CUDA"):
        check_device(f"cuda:{n}", "d")


def test_check_output_dir(tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    with pytest.raises(ValueError, match="`--out`.*is a file"):
        check_output_dir(f, "--out")
    with pytest.raises(ValueError, match="`--out`.*is a file, not a folder"):
        check_output_dir(f / "sub" / "deeper", "--out")
    new = tmp_path / "new" / "deeper"
    assert check_output_dir(new, "--out") == new and not new.exists()
    assert check_output_dir(new, "--out", create=True).is_dir()
    assert check_output_dir(tmp_path, "--out") == tmp_path


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_check_output_dir_not_writable(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="not writable"):
            check_output_dir(ro / "x", "--out")
        with pytest.raises(ValueError, match="not writable"):
            check_output_file(ro / "x.json", "--json")
    finally:
        ro.chmod(0o700)


def test_check_output_file(tmp_path):
    with pytest.raises(ValueError, match="`--json`.*is a folder"):
        check_output_file(tmp_path, "--json")
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(ValueError, match="`--json`.*is a file, not a folder"):
        check_output_file(f / "out.json", "--json")
    with pytest.raises(ValueError, match=r"`--out`.*must end in \.pt"):
        check_output_file(tmp_path / "w.pth.tar", "--out", suffix=".pt")
    assert check_output_file(tmp_path / "new" / "m.json", "--json").name == "m.json"
    assert not (tmp_path / "new").exists()  # nothing is created


def test_check_input_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="`INPUT`"):
        check_input_file(tmp_path / "missing.npz", "INPUT")
    with pytest.raises(ValueError, match="`INPUT`.*is a folder"):
        check_input_file(tmp_path, "INPUT")


@given(st.floats(allow_nan=False, allow_infinity=False, width=64))
def test_check_int_rejects_every_fractional_float(x):
    if x.is_integer():
        assert check_int(x, "k") == int(x)
    else:
        with pytest.raises(ValueError, match="`k` must be an integer"):
            check_int(x, "k")


def test_check_int_and_ints():
    assert check_int(torch.tensor(3), "k") == 3
    for bad in (True, "3", None):
        with pytest.raises(TypeError, match="`k` must be an integer, got"):
            check_int(bad, "k")
    for bad in (math.nan, math.inf, 2.7):
        with pytest.raises(ValueError, match="`k` must be an integer, got"):
            check_int(bad, "k")
    with pytest.raises(ValueError, match="`k` must be an integer >= 1, got 0"):
        check_int(0, "k", low=1)
    with pytest.raises(ValueError, match="`k` must be an integer >= 1 and <= 3, got 2.5"):
        check_int(2.5, "k", low=1, high=3)
    assert check_ints([1, 5.0], "ks", low=1) == (1, 5)
    with pytest.raises(ValueError, match=r"`ks\[1\]`"):
        check_ints((1, 2.7), "ks", low=1)
    with pytest.raises(ValueError, match="`ks` must not be empty"):
        check_ints((), "ks")
    with pytest.raises(TypeError, match="`ks`"):
        check_ints("15", "ks")


def test_check_number():
    assert check_number(0.5, "lr", low=0, low_open=True) == 0.5
    with pytest.raises(ValueError, match="`lr` must be > 0"):
        check_number(-1, "lr", low=0, low_open=True)
    with pytest.raises(ValueError, match="`lr` must be finite"):
        check_number(math.nan, "lr")
    with pytest.raises(TypeError, match="`lr`"):
        check_number("0.1", "lr")
    with pytest.raises(ValueError, match="`p` must be < 1"):
        check_number(1.0, "p", high=1, high_open=True)


@pytest.mark.parametrize("where", [0, 1, -1])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_check_finite_finds_a_bad_value_in_any_block(monkeypatch, where, bad):
    """Tested in blocks of FINITE_BLOCK elements (bounded temporaries): a single bad
    value in the first, second or last block, of a contiguous or a strided tensor, is found and
    counted."""
    import bayesurl._checks as C

    monkeypatch.setattr(C, "FINITE_BLOCK", 7)
    x = torch.zeros(6, 5)
    flat_pos = [0, 8, 29][[0, 1, -1].index(where)]
    x.view(-1)[flat_pos] = bad
    for t in (x, x.T):  # x.T is not contiguous
        with pytest.raises(ValueError, match=r"`emb` contains non-finite values") as err:
            C.check_finite(t, "emb")
        assert ("1 NaN, 0 inf" if math.isnan(bad) else "0 NaN, 1 inf") in str(err.value)
    C.check_finite(torch.zeros(6, 5), "emb")
    C.check_finite(torch.zeros(0, 5), "emb")
    C.check_finite(torch.ones(3, dtype=torch.long), "emb")


@pytest.mark.parametrize(
    ("kappa", "options", "message"),
    [
        ([1.0, float("nan")], {}, "contains NaN"),
        ([1.0, -0.5], {}, "non-negative, got min -0.5"),
        ([1.0, 0.0], {"positive": True}, "must be positive"),
        ([1.0, float("inf")], {"allow_inf": False}, "must be finite"),
    ],
)
def test_check_concentration_names_the_argument(kappa, options, message):
    with pytest.raises(ValueError, match=f"`kap`.*{message}"):
        check_concentration(torch.tensor(kappa, dtype=torch.float64), "kap", **options)


def test_check_concentration_keeps_floating_input_and_converts_integers():
    k = torch.tensor([0.0, float("inf"), 2.5], dtype=torch.float64)
    assert check_concentration(k, "kappa") is k  # zero and infinity are valid by default
    out = check_concentration(torch.tensor([1, 2]), "kappa", positive=True)
    assert out.dtype == torch.get_default_dtype()
    assert out.tolist() == [1.0, 2.0]
