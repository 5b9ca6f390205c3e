"""How far a compressed request may inflate: the size limit, and a ratio to what was sent.

A compressed body or gRPC message is a promise of size, not size. The size limit alone let a
61 KB gzip bomb inflate to the 64 MiB body limit: 0.25-0.57 s of server CPU per request, off
the loop but still the server's. zlib's best case is about 1,030 to 1; JSON tensors of one
repeated value reach 680, random floats about 1.1. So past :data:`RATIO_FLOOR` inflated bytes,
inflation also stops once the output passes :data:`MAX_INFLATE_RATIO` times the compressed size:
the bomb is refused after 16 MiB of work, a quarter of what it cost, while any body up to
16 MiB inflates as before and larger ones up to 200 times their compressed size.
"""

from __future__ import annotations

__all__ = ["MAX_INFLATE_RATIO", "RATIO_FLOOR", "inflate_limit"]

MAX_INFLATE_RATIO = 200
RATIO_FLOOR = 16 << 20


def inflate_limit(compressed_bytes: int, limit: int) -> int:
    """The most bytes ``compressed_bytes`` may inflate to, within the size ``limit``."""
    return min(limit, max(RATIO_FLOOR, MAX_INFLATE_RATIO * compressed_bytes))
