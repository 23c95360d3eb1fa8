"""ApiVersions (18): derived from the router, so we advertise exactly what we serve."""
from typing import Any

from ...protocol.api_keys import ApiKey
from ...protocol.messages import Encoded
from ..router import RequestContext, handler, supported_versions

# The answer per version, encoded once: every client connection asks first, and
# what the router serves does not change while the broker runs.
_ENCODED: dict[int, Encoded] = {}


@handler(ApiKey.API_VERSIONS, 0, 3)
async def api_versions(ctx: RequestContext, req: Any) -> Any:
    answer = _ENCODED.get(ctx.api_version)
    if answer is None:
        cls = ctx.cls()
        keys = [cls.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                for k, (lo, hi) in sorted(supported_versions().items())]
        body = ctx.response(error_code=0, api_keys=keys, throttle_time_ms=0)
        answer = _ENCODED[ctx.api_version] = Encoded(bytes(body.encode(version=ctx.api_version)))
    return answer
