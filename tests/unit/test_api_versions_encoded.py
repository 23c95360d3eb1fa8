"""ApiVersions answers with a body encoded once per version: the frame is the same
bytes the response object encodes to, and decodes to what the router serves."""
import asyncio

import pytest

from semel.broker import handlers  # noqa: F401  (registers every handler)
from semel.broker.handlers.api_versions import api_versions
from semel.broker.router import RequestContext, supported_versions
from semel.broker.session import Connection
from semel.protocol.messages import API_VERSIONS_KEY, decode_response, encode_response, response_class


def _fresh(version: int):
    cls = response_class(API_VERSIONS_KEY)
    keys = [cls.ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in sorted(supported_versions().items())]
    return cls(version=version, error_code=0, api_keys=keys, throttle_time_ms=0)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_encoded_answer_is_the_response_objects_bytes(version):
    ctx = RequestContext(None, API_VERSIONS_KEY, version, 7, "c", "peer", Connection("peer", "?", None, None))
    for _ in range(2):      # built on the first call, reused on the second
        body = asyncio.run(api_versions(ctx, None))
        frame = encode_response(API_VERSIONS_KEY, version, 7, body)
        assert frame == encode_response(API_VERSIONS_KEY, version, 7, _fresh(version))
    corr, decoded = decode_response(API_VERSIONS_KEY, version, frame[4:])
    assert corr == 7 and decoded.error_code == 0
    assert {k.api_key: (k.min_version, k.max_version) for k in decoded.api_keys} == supported_versions()
