"""Where a transactional id is coordinated, and branch ids that land beside their parent.

Kafka places a transactional id (or group id) on partition abs(String.hashCode(id)) % N
of its internal topic, so Kafka's tooling computes the same placement as semel. An
atomic Spark batch (semel/spark/atomic.py) needs its parent transaction and every
branch on ONE coordinator, for every N and without the client knowing N: so a branch
id is made to hash exactly like its parent. Java's hash is a polynomial over UTF-16
code units, h(p + x) = h(p) * 31^len(x) + h(x) (mod 2^32), so a 7-character suffix
drawn from 31 consecutive characters ('A'..'_', a base-31 digit each; 31^7 > 2^32)
can reach any hash. The suffix is computed, not searched: the same inputs give the
same id after a restart. Dependency-free: the broker and the Spark sink both import it.
"""
from __future__ import annotations

_MASK = 0xFFFFFFFF
_INT_MIN = -(1 << 31)
_SUFFIX_LEN = 7
_DIGIT0 = ord("A")             # digits 'A'..'_' (31 consecutive ASCII characters)
_POW = pow(31, _SUFFIX_LEN)    # 31^7 = 27,512,614,111 > 2^32: every residue has a suffix
# h(suffix of seven 'A's): the digits' base is subtracted once, then the rest is base 31.
_BASE_HASH = sum(_DIGIT0 * 31 ** k for k in range(_SUFFIX_LEN)) & _MASK


def _unsigned_hash(s: str) -> int:
    data = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & _MASK
    return h


def java_string_hash(s: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... over UTF-16 code units, as a signed int32."""
    h = _unsigned_hash(s)
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: str | None, partitions: int) -> int:
    """Kafka's Utils.abs(key.hashCode) % partitions (Utils.abs maps Integer.MIN_VALUE to 0)."""
    h = java_string_hash(key or "")
    return (0 if h == _INT_MIN else abs(h)) % partitions


def aligned(parent: str, name: str) -> str:
    """`name` plus a 7-character suffix such that the result's Java hash equals the
    parent's: the result is coordinated on the parent's partition for any partition count."""
    need = (_unsigned_hash(parent) - _unsigned_hash(name) * _POW - _BASE_HASH) & _MASK
    digits = []
    for _ in range(_SUFFIX_LEN):     # need < 2^32 < 31^7: seven base-31 digits suffice
        need, d = divmod(need, 31)
        digits.append(chr(_DIGIT0 + d))
    return name + "".join(reversed(digits))
