"""eos chaos fixtures: the same real components as the integration tests."""
import importlib.util
import sys
from pathlib import Path

_NAME = "semel_eos_test_fixtures"
if _NAME not in sys.modules:
    _path = Path(__file__).parents[2] / "integration" / "eos" / "eos_fixtures.py"
    _spec = importlib.util.spec_from_file_location(_NAME, _path)
    sys.modules[_NAME] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_NAME])

from semel_eos_test_fixtures import *  # noqa: E402,F401,F403 - fixtures register by name
