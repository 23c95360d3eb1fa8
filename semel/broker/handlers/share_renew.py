"""Acquisition-lock renewal (KIP-1222) on ShareFetch and ShareAcknowledge v2.

A consumer that needs longer than the lock duration to process a record acknowledges
it with type 4 (renew): the record stays with that member, its delivery count
unchanged, and its lock runs for a full lock duration from now
(share_partition.SharePartition.acknowledge). Kafka's rules for the requests:

- renew exists from v2 on, and only in a request whose IsRenewAck is set; anywhere
  else type 4 is not an acknowledge type (INVALID_REQUEST for that partition);
- a ShareFetch that renews fetches nothing new: its MaxWaitMs, MinBytes, MaxBytes and
  MaxRecords must be 0 (INVALID_REQUEST for the whole request otherwise), and it is
  answered at once with the acknowledgement results.
"""
from __future__ import annotations

from typing import Any

from ...coordinator.share_coordinator import ShareCoordinator
from ...protocol.errors import KafkaError
from ..router import RequestContext

RENEW_VERSION = 2


def renew_at(ctx: RequestContext, req: Any, share: ShareCoordinator) -> int | None:
    """The time renewals of this request count from, or None where it may not renew."""
    if ctx.api_version >= RENEW_VERSION and getattr(req, "is_renew_ack", False):
        return share.clock()
    return None


def renew_fetch_error(req: Any) -> KafkaError:
    """INVALID_REQUEST for a renewing ShareFetch that also asks for records."""
    if req.max_wait_ms or req.min_bytes or req.max_bytes or req.max_records:
        return KafkaError.INVALID_REQUEST
    return KafkaError.NONE


def lock_timeout(ctx: RequestContext, lock_ms: int) -> dict[str, int]:
    """ShareAcknowledge answers the group's lock duration from v2 on, so that a consumer
    knows how long a renewed lock runs."""
    return {"acquisition_lock_timeout_ms": lock_ms} if ctx.api_version >= RENEW_VERSION else {}
