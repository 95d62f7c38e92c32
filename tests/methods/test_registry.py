"""The method registry: one registration per class, every built-in module loaded on first use, and a
user's class found by its import path (and named by it in config.yaml)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml

from pfl.errors import ConfigError
from pfl.methods import Method, class_path, method_class, methods, register
from pfl.methods import registry as reg

CONF = Path(__file__).resolve().parents[2] / "conf" / "method"


@pytest.fixture
def scratch_name():
    yield "_registry_test_method"
    reg._REGISTRY.pop("_registry_test_method", None)


def test_register_returns_the_class_and_makes_it_known_by_its_name(scratch_name):
    class Mine(Method):
        name = scratch_name

    assert register(Mine) is Mine
    assert register(Mine) is Mine  # registering the same class again is harmless
    assert method_class(scratch_name) is Mine and methods()[scratch_name] is Mine
    # a class registered outside pfl.methods is still recorded by its import path: another process
    # (a resume, a sweep run) finds it only by importing its module
    assert class_path(Mine) == f"{__name__}.{Mine.__qualname__}"


def test_register_refuses_a_nameless_class_and_a_second_class_under_a_taken_name(scratch_name):
    class Nameless(Method):
        name = ""

    with pytest.raises(ValueError, match="Nameless needs a class attribute `name`"):
        register(Nameless)

    class First(Method):
        name = scratch_name

    class Second(Method):
        name = scratch_name

    register(First)
    with pytest.raises(ValueError, match=f"two methods are named '{scratch_name}': .*First and .*Second"):
        register(Second)
    assert method_class(scratch_name) is First


def test_methods_loads_every_module_once_and_lists_every_configured_method_sorted(monkeypatch):
    monkeypatch.setattr(reg, "_LOADED", False)
    listed = methods()
    assert reg._LOADED is True
    modules = [p.stem for p in (Path(reg.__file__).parent).glob("*.py") if p.stem != "__init__"]
    assert all(f"pfl.methods.{m}" in sys.modules for m in modules)
    configured = {yaml.safe_load(p.read_text())["method"]["name"] for p in CONF.glob("*.yaml")}
    assert configured <= set(listed)
    assert list(listed) == sorted(listed)
    listed.pop("ditto")  # a copy: the registry is not changed through it
    assert "ditto" in methods()


def test_a_fresh_registry_imports_every_method_module_on_its_first_call_only(monkeypatch):
    spec = importlib.util.find_spec("pfl.methods.registry")  # the loaded module's own spec and source
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    imported: list[str] = []
    monkeypatch.setattr(fresh.importlib, "import_module", imported.append)
    assert fresh.methods() == {}  # nothing registered into this copy: the modules were imported before
    modules = sorted(p.stem for p in Path(reg.__file__).parent.glob("*.py") if p.stem != "__init__")
    assert imported == [f"pfl.methods.{m}" for m in modules]
    fresh.methods()
    assert len(imported) == len(modules)


def test_methods_imports_the_modules_only_on_its_first_call(monkeypatch):
    monkeypatch.setattr(reg, "_LOADED", True)
    imported = []
    monkeypatch.setattr(reg.importlib, "import_module", imported.append)
    methods()
    assert imported == []


def test_an_unknown_name_is_refused_with_where_the_choices_are_listed():
    with pytest.raises(ConfigError, match="unknown method 'nosuch'") as err:
        method_class("nosuch")
    assert err.value.field == "method.name" and "python -m pfl methods" in err.value.fix
    assert "Method subclass" in err.value.fix and "ditto" not in err.value.fix  # no list of every method


def test_a_mistyped_name_is_answered_with_the_closest_method():
    with pytest.raises(ConfigError) as err:
        method_class("dito")
    assert str(err.value) == "method.name: unknown method 'dito' (did you mean ditto?)"


def test_an_import_path_names_a_user_class_and_a_registered_name_its_class():
    from pfl.methods.ditto import Ditto

    assert method_class("pfl.methods.ditto.Ditto") is Ditto
    with pytest.raises(ConfigError, match="cannot import 'nosuchpackage.Method'") as err:
        method_class("nosuchpackage.Method")
    assert err.value.field == "method.name" and "PYTHONPATH" in err.value.fix
    with pytest.raises(ConfigError, match="cannot import 'pfl.methods.ditto.Nothing'"):
        method_class("pfl.methods.ditto.Nothing")  # the module imports, the attribute does not exist
    with pytest.raises(ConfigError, match="is not a subclass of pfl.methods.Method"):
        method_class("pfl.methods.ditto.ProxMode")
    with pytest.raises(ConfigError, match="is not a subclass of pfl.methods.Method"):
        method_class("pathlib.Path")  # a class, but not a method


class Shadow(Method):
    """Not registered, and named like a built-in method."""

    name = "ditto"


def test_class_path_is_the_registered_name_or_else_the_import_path():
    assert class_path(method_class("ditto")) == "ditto"
    assert class_path(Shadow) == f"{__name__}.Shadow"
    assert method_class(class_path(Shadow)) is Shadow


def test_the_readmes_methods_table_names_every_registered_method():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## Methods\n", 1)[1].split("\n## ", 1)[0]
    built_in = {name for name, cls in methods().items() if cls.__module__.startswith("pfl.methods.")}
    missing = built_in - set(re.findall(r"`([a-z_]+)`", section))
    assert not missing, f"add {sorted(missing)} to README.md's Methods table"


# -- the catalogue: names and descriptions read from the sources, without importing them ----------
def test_the_catalogue_read_from_the_sources_equals_the_imported_registry():
    listed = reg.catalogue()
    builtin = {n: c for n, c in methods().items() if c.__module__.startswith("pfl.methods.")}
    assert listed is not None and list(listed) == list(builtin)  # the same names, sorted
    for name, cls in builtin.items():
        assert listed[name] == reg.Listed(cls.__module__, cls.description), name
    assert reg.method_names() == list(listed)


def write_module(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(f"from pfl.methods.registry import register\n\n\n{body}")


def test_the_scan_reads_registered_classes_only_and_says_none_when_one_is_not_literal(tmp_path):
    assert reg.scan_sources(tmp_path, "pkg") is None  # no sources (e.g. compiled files only): import to tell
    write_module(tmp_path, "b_two", '@register\nclass Two:\n    name = "two"\n    description = "second"\n')
    write_module(tmp_path, "a_one", '@register\nclass One:\n    name: str = "one"\n    description = "first"\n')
    write_module(tmp_path, "c_helper", 'class Helper:\n    name = "helper"\n    description = "not registered"\n')
    assert reg.scan_sources(tmp_path, "pkg") == {
        "one": reg.Listed("pkg.a_one", "first"),
        "two": reg.Listed("pkg.b_two", "second"),
    }
    write_module(tmp_path, "d_inherits", '@register\nclass Three(Two):\n    name = "three"\n')  # description inherited
    assert reg.scan_sources(tmp_path, "pkg") is None
    write_module(tmp_path, "d_inherits", '@register\nclass Three:\n    name = NAME\n    description = "x"\n')
    assert reg.scan_sources(tmp_path, "pkg") is None


def test_without_a_catalogue_a_name_is_found_by_importing_every_method(monkeypatch):
    from pfl.methods.fedprox import FedProx

    imported = []

    def import_all():
        imported.append(True)
        reg._REGISTRY.setdefault("fedprox", FedProx)  # what importing its module does
        return dict(reg._REGISTRY)

    monkeypatch.setattr(reg, "catalogue", lambda: None)
    monkeypatch.delitem(reg._REGISTRY, "fedprox")
    monkeypatch.setattr(reg, "methods", import_all)
    assert method_class("fedprox") is FedProx and imported
    assert "fedprox" in reg.method_names()


def test_the_catalogue_is_read_once_and_names_come_from_it_without_importing(monkeypatch):
    assert reg.catalogue() is reg.catalogue()  # the sources are parsed once per process

    def no_import():
        raise AssertionError("imported every method")

    monkeypatch.setattr(reg, "methods", no_import)
    assert reg.method_names() == list(reg.catalogue())


def test_a_built_in_name_imports_only_its_own_module(monkeypatch):
    def no_import():
        raise AssertionError("imported every method")

    monkeypatch.setattr(reg, "methods", no_import)
    monkeypatch.delitem(sys.modules, "pfl.methods.fedprox")  # restored afterwards, with the registry entry
    monkeypatch.delitem(reg._REGISTRY, "fedprox")
    cls = method_class("fedprox")
    assert cls.name == "fedprox" and cls.__module__ == "pfl.methods.fedprox" and "pfl.methods.fedprox" in sys.modules


def test_the_descriptions_listed_are_the_catalogues_and_every_method_registered_in_this_process(
    monkeypatch, scratch_name
):
    class Described(Method):
        name = scratch_name
        description = "a user's method"

    register(Described)
    listed = reg.registered_descriptions()
    assert list(listed) == sorted(listed) and listed[scratch_name] == "a user's method"
    built_in = reg.catalogue()
    assert {n: listed[n] for n in built_in} == {n: m.description for n, m in built_in.items()}
    Described.description = None  # a method without a description is listed with an empty one
    assert reg.registered_descriptions()[scratch_name] == ""
    with monkeypatch.context() as m:  # with a catalogue, nothing is imported to list the built-ins
        m.setattr(reg, "methods", lambda: pytest.fail("imported every method to list them"))
        assert reg.registered_descriptions() == listed | {scratch_name: ""}
    monkeypatch.setattr(reg, "catalogue", lambda: None)  # no catalogue: the imported registry says it all
    assert reg.registered_descriptions() == {n: c.description or "" for n, c in methods().items()}
