"""The named API keys agree with the wire: every request class the codec knows
carries the key its ApiKey name says, and the broker routes only named keys."""
import re

import semel.broker.handlers  # noqa: F401  (registers every route)
from semel.broker.router import ROUTES
from semel.protocol.api_keys import ApiKey
from semel.protocol.messages import REQUEST_CLASSES


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).upper()


def test_names_match_the_codec_classes():
    for key, cls in REQUEST_CLASSES.items():
        assert ApiKey(key).name == _snake(cls.__name__.removesuffix("Request")), cls.__name__


def test_routes_are_keyed_by_name():
    assert ROUTES
    for key, route in ROUTES.items():
        assert isinstance(key, ApiKey), (key, route.fn.__name__)
        assert key in REQUEST_CLASSES
