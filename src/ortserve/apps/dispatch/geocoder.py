"""A pluggable geocoding service for order addresses: called off the event loop with a timeout,
answers kept in an LRU cache with a time to live; the gazetteer's rules stand when it is slow,
fails or knows nothing.

Plug one in by subclassing the pipeline::

    class MyDispatch(DispatchPipeline):
        def __init__(self, context: PipelineContext) -> None:
            super().__init__(context, geocoder=GeocoderHook(my_service_lookup))

and naming ``mypackage.module:MyDispatch`` as the model's ``pipeline``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["DEFAULT_TIMEOUT_S", "DEFAULT_TTL_S", "Geocode", "GeocoderHook"]

logger = logging.getLogger(__name__)

Geocode = Callable[[str], "tuple[float, float] | None"]
"""An address to its WGS84 (lat, lon), or None when the service does not know it."""
DEFAULT_TIMEOUT_S = 0.3
DEFAULT_TTL_S = 24 * 3600.0


class GeocoderHook:
    """Calls ``geocode`` in a worker thread, at most ``timeout_s`` per address.

    Args:
        geocode: the service (blocking is fine: it runs in a thread).
        timeout_s: after this the rules' placement is used (the call is left to finish alone).
        cache_size: addresses remembered (least recently used evicted first).
        ttl_s: how long an answer is reused.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        geocode: Geocode,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        cache_size: int = 4096,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._geocode = geocode
        self.timeout_s = timeout_s
        self._size = cache_size
        self._ttl_s = ttl_s
        self._clock = clock
        self._cache: OrderedDict[str, tuple[tuple[float, float], float]] = OrderedDict()

    def cached(self, address: str) -> tuple[float, float] | None:
        """A fresh cached answer, if any (refreshing its recency)."""
        entry = self._cache.get(address)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            del self._cache[address]
            return None
        self._cache.move_to_end(address)
        return entry[0]

    async def locate(self, address: str) -> tuple[float, float] | None:
        """The service's answer for ``address``, or None (timeout, error, unknown, off Earth)."""
        hit = self.cached(address)
        if hit is not None:
            return hit
        try:
            found = await asyncio.wait_for(asyncio.to_thread(self._geocode, address), self.timeout_s)
        except TimeoutError:
            logger.debug("geocoder timed out after %.0f ms on %r", self.timeout_s * 1e3, address)
            return None
        except Exception:
            logger.warning("geocoder failed on %r; the gazetteer's placement is used", address, exc_info=True)
            return None
        if found is None or not _on_earth(found):
            return None
        self._cache[address] = (found, self._clock() + self._ttl_s)
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return found


def _on_earth(point: tuple[float, float]) -> bool:
    lat, lon = point
    return math.isfinite(lat) and math.isfinite(lon) and -90 <= lat <= 90 and -180 <= lon <= 180
