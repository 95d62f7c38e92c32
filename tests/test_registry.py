"""pfl.registry: names, duplicates, import paths, lazily imported built-ins and the fix offered."""

from __future__ import annotations

import functools
import sys
import types

import pytest

from pfl.config import AGGREGATORS, PROTOCOLS
from pfl.errors import ConfigError
from pfl.registry import Registry, origin, require_choice


def rule_a():
    return "a"


def rule_b():
    return "b"


def test_names_keep_the_order_of_registration_and_a_taken_name_is_refused_in_one_line():
    reg: Registry = Registry("rule", "group.rule", "mod.rule")
    reg.add("first", rule_a)
    reg.add("second", rule_b)
    assert reg.names() == ["first", "second"] and reg.get("second") is rule_b
    reg.add("first", rule_a)  # the same definition again (a module imported twice): accepted
    assert len(reg) == 2
    with pytest.raises(ValueError) as err:
        reg.add("first", rule_b)
    assert str(err.value) == (f"two rules are named 'first': {__name__}.rule_a and {__name__}.rule_b")
    for bad in ("a.b", "", 7):
        with pytest.raises(ValueError, match="non-empty string without dots"):
            reg.add(bad, rule_a)
    assert reg.names() == ["first", "second"]


def test_an_entry_without_a_qualname_is_told_apart_by_its_repr():
    plain = object()  # a module (its class's) but no qualname
    assert origin(rule_a) == f"{__name__}.rule_a" and origin(plain) == repr(plain)
    reg: Registry = Registry("rule", "group.rule", "mod.rule")
    reg.add("p", functools.partial(rule_a))
    with pytest.raises(ValueError, match="two rules are named 'p': functools.partial"):
        reg.add("p", functools.partial(rule_b))  # two definitions, though both come from functools


def test_an_unknown_name_offers_the_close_one_or_every_choice():
    reg: Registry = Registry("rule", "group.rule", "mod.rule", other_choices=("x:<Name>",))
    reg.add("median", rule_a)
    reg.add("mean", rule_b)
    with pytest.raises(ConfigError) as err:
        reg.get("medain")
    assert str(err.value) == "group.rule: unknown rule 'medain' (did you mean median?)"
    with pytest.raises(ConfigError) as err:
        reg.get("zzz")
    assert str(err.value) == (
        "group.rule: unknown rule 'zzz' (choose one of median, mean, x:<Name>, or package.module.name of one "
        "of your own)"
    )


def test_an_import_path_finds_a_registered_definition(monkeypatch):
    reg: Registry = Registry("rule", "group.rule", "mod.rule")
    module = types.ModuleType("user_rules")
    module.ok, module.loose = rule_a, rule_b
    monkeypatch.setitem(sys.modules, "user_rules", module)
    reg.add("ok", rule_a)
    assert reg.get("user_rules.ok") is rule_a and "user_rules.ok" in reg
    with pytest.raises(ConfigError, match=r"^group.rule: 'user_rules.loose' is not a registered rule \(decorate it "):
        reg.get("user_rules.loose")
    assert "user_rules.loose" not in reg and "nowhere_at_all.ok" not in reg


def test_the_help_lists_the_registered_names_and_other_choices():
    reg: Registry = Registry("rule", "group.rule", "mod.rule", other_choices=("x:<Name>",))
    reg.add("median", rule_a)
    assert reg.help() == "one of: median, x:<Name>; or package.module.name of one of your own"


def test_the_fit_help_reads_the_registries(monkeypatch):
    from pfl.federation.robust import aggregator
    from pfl.runner.args import build_fit_parser

    monkeypatch.setattr(AGGREGATORS, "_entries", AGGREGATORS.entries())
    aggregator("loudest")(rule_a)
    helps = {a.dest: a.help for a in build_fit_parser("fedavg")._actions}
    assert helps["server.aggregator"].startswith(
        "one of: mean, median, trimmed_mean, krum, multi_krum, norm_clip, loudest; or package.module.name of one "
        "of your own. Applied to the uploads"
    )
    assert helps["eval.protocols"].startswith("one of: local, sg, global, new;")
    assert "synthetic_regression, torchvision:<Name>, hf:<folder or hub name>;" in helps["data.source"]


def test_built_ins_are_imported_on_first_lookup():
    assert "pfl.federation.robust" in AGGREGATORS.builtins and "pfl.metrics.protocol_registry" in PROTOCOLS.builtins
    assert AGGREGATORS.names()[:6] == ["mean", "median", "trimmed_mean", "krum", "multi_krum", "norm_clip"]
    assert PROTOCOLS.names()[:4] == ["local", "sg", "global", "new"]
    reg: Registry = Registry("rule", "group.rule", "mod.rule", builtins=("tests.nonexistent_module",))
    with pytest.raises(ModuleNotFoundError):
        reg.names()


def test_a_built_in_that_looks_its_registry_up_while_imported_sees_its_own_entries_so_far(tmp_path, monkeypatch):
    reg: Registry = Registry("rule", "group.rule", "mod.rule", builtins=("reg_first", "reg_second"))
    home = types.ModuleType("reg_home")
    home.reg, home.seen = reg, []
    monkeypatch.setitem(sys.modules, "reg_home", home)
    (tmp_path / "reg_first.py").write_text(
        "from reg_home import reg, seen\nreg.add('a1', len)\nseen.append(reg.names())\nreg.add('a2', abs)\n"
    )
    (tmp_path / "reg_second.py").write_text("from reg_home import reg\nreg.add('b1', min)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        # the built-ins are imported once, in their order: the look-up inside the first imports no other
        assert reg.names() == ["a1", "a2", "b1"] and home.seen == [["a1"]]
    finally:
        for name in ("reg_first", "reg_second"):
            sys.modules.pop(name, None)


def test_a_fixed_choice_is_refused_naming_the_field_the_kind_and_the_closest_option():
    require_choice("disk", ("memory", "disk"), "trainer.client_store", "store")
    with pytest.raises(ConfigError) as err:
        require_choice("dsk", ("memory", "disk"), "trainer.client_store", "store")
    assert (err.value.field, err.value.problem) == ("trainer.client_store", "unknown store 'dsk'")
    assert "disk" in err.value.fix
    with pytest.raises(ConfigError, match=r"^data\.partition: unknown value 'x'"):
        require_choice("x", ("iid",), "data.partition")


def test_a_path_into_main_that_does_not_import_says_what_main_is():
    # config.yaml names a class or function of a script or notebook as __main__.X, which another process
    # (a resume, a sweep run, Run.model() later) cannot import: the fix says so, for every kind of entry.
    from pfl.data.sources import SOURCES
    from pfl.methods import method_class
    from pfl.models import ModelConfig, build_model

    calls = {
        "method.name": lambda: method_class("__main__.MyMethod"),
        "model.name": lambda: build_model(ModelConfig(name="__main__.MyNet"), (1, 8, 8), 10),
        "data.source": lambda: SOURCES.get("__main__.my_source"),
    }
    for field, call in calls.items():
        with pytest.raises(ConfigError) as err:
            call()
        assert str(err.value).startswith(f"{field}: ")
        assert "__main__ is the script or notebook that started the run" in str(err.value)
        assert "define it in a module" in str(err.value)
    with pytest.raises(ConfigError) as err:
        method_class("no_such_module_here.MyMethod")
    assert "__main__" not in str(err.value)  # any other module keeps the usual fix
