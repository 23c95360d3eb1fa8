"""eos integration fixtures: see eos_fixtures.py (shared with tests/chaos/eos)."""
import importlib.util
import sys
from pathlib import Path

_NAME = "semel_eos_test_fixtures"
if _NAME not in sys.modules:
    _spec = importlib.util.spec_from_file_location(_NAME, Path(__file__).with_name("eos_fixtures.py"))
    sys.modules[_NAME] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_NAME])

from semel_eos_test_fixtures import *  # noqa: E402,F401,F403 - fixtures register by name
from semel_eos_test_fixtures import S3_CLIENT_KW, EosBroker  # noqa: E402,F401
