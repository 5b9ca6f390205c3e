"""Where a search comes from and where a hotword belongs: province and city administrative codes.

A hotword's region is 0 (national), a province code (440000: 广东) or a city's (440300: 深圳); a
searcher's ``region_id`` is 0, a province's, or any finer code (a city 440300, a district
440305), read as its city. A hotword is at home for a searcher of its own city, or of its
province when either side names only the province; it is nearby (half at home) for a
searcher elsewhere in its province: so 深圳天气预报 ranks first in 深圳, ahead of 广州's.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["NEARBY", "PROVINCES", "RegionTable", "city_of", "locality", "province_of"]

PROVINCES = (
    110000, 120000, 130000, 140000, 150000, 210000, 220000, 230000, 310000, 320000, 330000, 340000,
    350000, 360000, 370000, 410000, 420000, 430000, 440000, 450000, 460000, 500000, 510000, 520000,
    530000, 540000, 610000, 620000, 630000, 640000, 650000, 710000, 810000, 820000,
)  # fmt: skip
"""Province-level administrative codes; a city or district code maps to its province."""
NEARBY = 0.5
"""A hotword of another city of the searcher's province: this much at home."""


def province_of(region_id: int) -> int | None:
    """The province code of an administrative code (0, national, has none)."""
    code = region_id // 10000 * 10000
    return code if code in PROVINCES else None


def city_of(region_id: int) -> int | None:
    """The city (prefecture) code of a finer code, or None for 0 and province codes."""
    if province_of(region_id) is None or region_id % 10000 == 0:
        return None
    return region_id // 100 * 100


def locality(regions: npt.NDArray[np.int64], region_id: int) -> npt.NDArray[np.float64]:
    """Per hotword region: 1 at home for the searcher, ``NEARBY`` in another city of the
    searcher's province, 0 elsewhere, national, or for a national searcher."""
    return RegionTable(regions).locality(region_id)


class RegionTable:
    """:func:`locality` for a fixed set of hotword regions (the corpus), with each region's
    province and city worked out once: a query then costs two comparisons over the corpus.

    Args:
        regions: the hotwords' region codes.
    """

    __slots__ = ("_city", "_is_city", "_province", "size")

    def __init__(self, regions: npt.NDArray[np.int64]) -> None:
        self.size = len(regions)
        self._province = np.where(regions != 0, regions // 10000 * 10000, -1)
        self._city = regions // 100 * 100
        self._is_city = regions % 10000 != 0

    def locality(self, region_id: int) -> npt.NDArray[np.float64]:
        """Every region's locality for a searcher in ``region_id`` (see :func:`locality`)."""
        levels: npt.NDArray[np.float64] = np.zeros(self.size)
        province = province_of(region_id)
        if province is None:
            return levels
        same_province = self._province == province
        city = city_of(region_id)
        if city is None:
            levels[same_province] = 1.0
            return levels
        levels[same_province] = NEARBY
        levels[same_province & (~self._is_city | (self._city == city))] = 1.0
        return levels
