"""The one registry type behind every kind a user extends by name (``searchr1.registry``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from searchr1.registry import Registry


@dataclass(frozen=True)
class Needs:
    critic: bool = False


def test_register_lookup_and_the_one_unknown_message():
    reg: Registry = Registry("widget", "section.widget")

    @reg.register("b")
    def b():
        return "b"

    reg.add("a", len)
    assert reg.lookup("b") is b and reg["a"] is len
    assert reg.names() == ["a", "b"] == list(reg) and len(reg) == 2
    assert "a" in reg and "c" not in reg
    with pytest.raises(ValueError) as err:
        reg.lookup("c")
    assert str(err.value) == "section.widget: unknown widget 'c'; known: a, b"
    with pytest.raises(ValueError, match="unknown widget 'c'"):
        reg.check("c")
    reg.check("a")
    with pytest.raises(KeyError):
        reg["c"]  # the mapping keeps its usual contract
    assert reg.get("c") is None


def test_a_taken_name_is_refused_unless_override_says_so():
    reg: Registry = Registry("widget", "w")
    reg.add("x", len, "alias")
    reg.add("x", len)  # the same entry again: harmless (a module imported twice)
    with pytest.raises(
        ValueError, match=r"widget 'x' is already registered \(builtins\.len\); pass override=True"
    ):
        reg.add("x", abs)
    with pytest.raises(ValueError, match="widget 'alias' is already registered"):
        reg.register("y", "alias")(abs)
    assert "y" not in reg  # nothing was registered by the refused call
    reg.add("x", abs, override=True)
    assert reg["x"] is abs and reg["alias"] is len
    assert reg.remove("x") is abs and "x" not in reg
    with pytest.raises(KeyError):
        reg.remove("x")


def test_traits_are_recorded_with_the_entry():
    reg: Registry = Registry("estimator", "algorithm.advantage", traits=Needs)
    reg.add("plain", len)
    reg.add("critic", abs, critic=True)
    assert reg.traits_of("critic") == Needs(critic=True)
    assert reg.traits_of("plain") == Needs()
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        reg.traits_of("nope")
    with pytest.raises(TypeError):
        reg.add("typo", len, critics=True)
    plain: Registry = Registry("loss", "algorithm.policy_loss")
    with pytest.raises(TypeError, match="takes no traits"):
        plain.add("x", len, critic=True)


def test_builtins_are_imported_on_the_first_question(tmp_path, monkeypatch):
    (tmp_path / "widget_builtins.py").write_text(
        "from widget_registry import WIDGETS\nWIDGETS.add('builtin', len)\n"
    )
    (tmp_path / "widget_registry.py").write_text(
        "from searchr1.registry import Registry\n"
        "WIDGETS = Registry('widget', 'w', builtins=['widget_builtins'])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import widget_registry

    try:
        assert "widget_builtins" not in sys.modules  # nothing asked yet
        widget_registry.WIDGETS.add("user", abs)
        assert "widget_builtins" not in sys.modules
        assert widget_registry.WIDGETS.names() == ["builtin", "user"]
    finally:
        sys.modules.pop("widget_registry", None)
        sys.modules.pop("widget_builtins", None)


def test_a_builtin_module_that_fails_is_tried_again():
    reg: Registry = Registry("widget", "w", builtins=["searchr1_no_such_module"])
    for _ in range(2):
        with pytest.raises(ModuleNotFoundError):
            reg.names()
