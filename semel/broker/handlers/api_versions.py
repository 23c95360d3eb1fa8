"""ApiVersions (18): derived from the router, so we advertise exactly what we serve."""
from ...protocol.api_keys import ApiKey
from ..router import handler, supported_versions


@handler(ApiKey.API_VERSIONS, 0, 3)
async def api_versions(ctx, req):
    cls = ctx.cls()
    keys = [cls.ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in sorted(supported_versions().items())]
    return ctx.response(error_code=0, api_keys=keys, throttle_time_ms=0)
