"""The one registry shape: adding, lookup by typed name, traits, filtering, errors."""

import pytest

from bayesurl.registry import Registry


def test_register_get_traits_and_filter():
    reg = Registry("shape")

    @reg.register("Big-Square", corners=4, kind="polygon")
    class Square:
        pass

    @reg.register("circle", corners=0, kind="round")
    def circle():
        return "o"

    assert reg.get("big_square") is Square
    assert reg.get("BIG-SQUARE") is Square
    assert reg.get("circle") is circle
    assert reg.traits("big_square")["corners"] == 4
    assert reg.names() == ("big_square", "circle")
    assert reg.names(kind="round") == ("circle",)
    assert reg.names(kind=("round", "polygon")) == ("big_square", "circle")
    assert reg.names(corners=3) == ()
    assert "circle" in reg and "triangle" not in reg and 3 not in reg
    assert len(reg) == 2 and [e.name for e in reg] == ["big_square", "circle"]
    with pytest.raises(TypeError):
        reg.traits("circle")["corners"] = 1  # read-only


def test_errors_name_the_argument_and_list_valid_names():
    reg = Registry("estimator kind")
    reg.add("method", object)
    with pytest.raises(ValueError, match=r"unknown `estimator.kind` 'metod'; valid names: method"):
        reg.get("metod", argument="estimator.kind")
    with pytest.raises(ValueError, match="unknown estimator kind 'x'"):
        reg.get("x")
    with pytest.raises(ValueError, match="registered twice"):
        reg.add("method", int)
    reg.add("method", int, replace=True)
    assert reg.get("method") is int
    assert reg.remove("method").obj is int and len(reg) == 0
    with pytest.raises(ValueError, match="non-empty"):
        reg.add("", int)


def test_lazy_load_runs_once_before_first_lookup():
    calls = []
    reg = Registry("plugin", load=lambda: (calls.append(1), reg.add("p", 1)))
    assert calls == []
    assert reg.get("p") == 1 and reg.names() == ("p",)
    assert calls == [1]
