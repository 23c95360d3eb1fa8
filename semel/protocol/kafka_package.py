"""kafka-python's package without its client until something asks for the client.

semel's codec is kafka-python's message classes (`kafka.protocol.*`), but importing
any submodule first runs the package's `__init__`, which imports its whole client:
admin, consumer, producer, metrics, SASL, compression codecs. That is two thirds of
what a PySpark worker spends importing the sink (about 100 ms of 150 per worker
start), and every broker start pays it too, for nothing the protocol classes use.

defer_client() registers the package before anything of kafka-python is imported,
with its `__path__` but without running its `__init__`. The submodules in
`WITHOUT_CLIENT` import as ever. The first import of any other submodule, or lookup
of a name the `__init__` defines (`KafkaProducer`, `__version__`, `from kafka
import *`), runs the `__init__` first, once: kafka-python's own modules import each
other in a circle that only its `__init__`'s order resolves, so code that uses its
client finds the package exactly as it always was.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
from types import ModuleType
from typing import Any, Sequence

PACKAGE = "kafka"
# kafka-python's submodules that import none of its client (what semel uses of it).
WITHOUT_CLIENT = frozenset({"protocol", "errors", "structs", "util", "version", "partitioner"})


def defer_client() -> None:
    """Register kafka-python's package without running its `__init__` (see above); a
    no-op once anything has imported it, or where it is not installed."""
    if PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    package = importlib.util.module_from_spec(spec)
    shell = _Shell(package, spec.loader)
    package.__dict__["__getattr__"] = shell.attribute
    logging.getLogger(PACKAGE).addHandler(logging.NullHandler())  # the __init__'s first act
    sys.modules[PACKAGE] = package
    sys.meta_path.insert(0, shell)


def is_deferred() -> bool:
    """Whether kafka-python's `__init__` is still waiting to run (tests)."""
    return any(isinstance(f, _Shell) for f in sys.meta_path)


class _Shell(importlib.abc.MetaPathFinder):
    """Runs the package's `__init__` when something beyond WITHOUT_CLIENT is asked for."""

    def __init__(self, package: ModuleType, loader: importlib.abc.Loader):
        self.package, self.loader = package, loader

    def complete(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
            self.package.__dict__.pop("__getattr__", None)
            self.loader.exec_module(self.package)

    def attribute(self, name: str) -> Any:
        """Module `__getattr__`: a name the package itself defines."""
        if name in WITHOUT_CLIENT:   # `from kafka import errors` in kafka-python's own modules
            return importlib.import_module(f"{PACKAGE}.{name}")
        self.complete()
        return getattr(self.package, name)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        parts = fullname.split(".")
        if parts[0] != PACKAGE or len(parts) < 2 or parts[1] in WITHOUT_CLIENT:
            return None
        self.complete()
        loaded = sys.modules.get(fullname)
        if loaded is None:
            return None   # the ordinary finders import it, now with the package complete
        # The __init__ imported it: hand the import machinery that module, not a second copy.
        # It loads the spec of a module already in sys.modules (not the one returned here),
        # so the module carries this spec until _Loaded gives it its own back.
        spec = importlib.machinery.ModuleSpec(fullname, _Loaded(loaded), is_package=hasattr(loaded, "__path__"))
        loaded.__spec__ = spec
        return spec


class _Loaded(importlib.abc.Loader):
    def __init__(self, module: ModuleType):
        self.module, self.spec = module, module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec   # the import machinery set ours on it
