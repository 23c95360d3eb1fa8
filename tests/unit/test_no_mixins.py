"""semel's classes are composed, not mixed.

A class that inherits from two or more of semel's own classes shares one `self` with
all of them: each part then reads and writes attributes another part sets, and no
reader (or type checker) can tell which part owns what. docs/architecture.md keeps
every layer to parts that own their state and take their collaborators in their
constructors, so this test fails on any class of semel, in any of its packages, with
more than one base of semel's own that is not a Protocol (a Protocol only declares
what a class offers; it holds no state).
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType
from typing import Protocol

import semel

# Every layer: a package's modules import their optional extras (pyspark, aiohttp) only
# when used, so each imports here.
PACKAGES = tuple(importlib.import_module(f"semel.{info.name}")
                 for info in pkgutil.iter_modules(semel.__path__) if info.ispkg)


def _own_bases(cls: type) -> list[type]:
    """cls's direct bases that are semel's own classes and not Protocols."""
    return [b for b in cls.__bases__
            if b.__module__.split(".")[0] == "semel" and not getattr(b, "_is_protocol", False)]


def mixed_classes(module: ModuleType) -> list[str]:
    """Classes defined in `module` with more than one base of semel's own."""
    return [f"{module.__name__}.{name}({', '.join(b.__name__ for b in _own_bases(cls))})"
            for name, cls in inspect.getmembers(module, inspect.isclass)
            if cls.__module__ == module.__name__ and len(_own_bases(cls)) > 1]


def _modules(package: ModuleType) -> list[ModuleType]:
    return [importlib.import_module(info.name)
            for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]


def test_no_class_is_mixed_from_parts():
    modules = [m for package in PACKAGES for m in _modules(package)]
    names = {m.__name__ for m in modules}
    # the walk found every layer's modules, the check's workload among them
    assert {"semel.storage.log", "semel.coordinator.txn", "semel.broker.server", "semel.check.workload"} <= names
    assert [c for m in modules for c in mixed_classes(m)] == []


def test_the_check_sees_a_mixin_and_lets_a_protocol_pass():
    sample = ModuleType("semel.sample")

    class Part(Protocol):
        def run(self) -> None: ...

    class Loader:
        pass

    class Writer:
        pass

    class Mixed(Loader, Writer):
        pass

    class Composed(Loader, Part):
        pass

    for cls in (Part, Loader, Writer, Mixed, Composed):
        cls.__module__ = sample.__name__
        setattr(sample, cls.__name__, cls)
    assert mixed_classes(sample) == ["semel.sample.Mixed(Loader, Writer)"]
