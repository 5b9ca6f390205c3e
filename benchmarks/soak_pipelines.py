"""The soak's pipeline traffic: ``POST /v1/predict`` (hotword) and ``POST /v1/route`` (dispatch).

Each route gets a pool of request bodies drawn once from a seeded generator; the answer every
body should get is computed before the soak starts, in this process, by the same pipelines on
their own ONNX Runtime sessions (``ortserve.testing.pipeline_harness`` over a copy of the seed
models the server serves). During the soak every answer is compared with its body's reference:
the same keys, lists and strings, numbers within 1e-3 (scores are rounded to 4 places by the
pipelines; a batch of another size may move the last place). A body is sent many times, so an
answer that belongs to another request, or a pipeline left behind by a reload, shows as wrong.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
from soak_http import CheckedConnection, Record, RefusedOrLost

from ortserve.apps.hotword.corpus import CORPUS, load_corpus
from ortserve.apps.seeds import write_seed_apps
from ortserve.testing import ServerProcess, pipeline_harness

__all__ = [
    "PIPELINE_MODELS",
    "RATE_PER_S",
    "PipelineTraffic",
    "build_pools",
    "first_difference",
    "same_answer",
    "write_pipeline_models",
]

PIPELINE_MODELS = ("hotword", "dispatch")
ROUTES = {"predict": "/v1/predict", "route": "/v1/route"}
NOW = 1_759_017_600_000
"""2025-09-28 08:00 China time: close to the National Day holiday, so seasonal tags occur."""
_DAY_MS = 86_400_000
_REGIONS = (0, 110000, 110105, 310000, 440300, 510100, 330100)
_UNRELATED = ("量子计算机原理", "zzzz", "离散数学习题", "蒸汽机车")
_ADDRESSES = ("北京市朝阳区", "北京市海淀区", "上海市浦东新区", "火星基地")
_TOLERANCE = 1e-3
RATE_PER_S = {"predict": 20.0, "route": 10.0}


def write_pipeline_models(root: Path, reference_root: Path) -> None:
    """Train the seed apps (deterministic) into the server's repository and copy them into
    ``reference_root`` for the in-process reference."""
    write_seed_apps(root)
    for model in PIPELINE_MODELS:
        shutil.copytree(root / model, reference_root / model)


def _hotword_bodies(rng: np.random.Generator, words: list[str], count: int) -> list[bytes]:
    bodies = []
    for _ in range(count):
        pick = rng.random()
        if pick < 0.1:
            query = str(rng.choice(_UNRELATED))
        else:
            word = str(rng.choice(words))
            query = word if pick < 0.6 else word[: max(2, len(word) // 2)]  # whole word or a prefix
        document: dict[str, object] = {
            "query": query,
            "timestamp": NOW + int(rng.integers(-40, 40)) * _DAY_MS,
            "top_k": int(rng.integers(1, 11)),
        }
        region = int(rng.choice(_REGIONS))
        if region:
            document["region_id"] = region
        bodies.append(orjson.dumps(document))
    return bodies


def _dispatch_bodies(rng: np.random.Generator, count: int) -> list[bytes]:
    """Orders of equal weight: the assignment is then exact (best-each or the rectangular
    assignment), so every answer has one right value. Unequal weights go to a MIP with a
    1 s wall-time budget whose answer depends on how loaded the machine is (the first soak
    with them had 13 answers of 9,041 that differed from the unloaded reference)."""
    bodies = []
    for _ in range(count):
        orders = []
        for i in range(int(rng.integers(1, 25))):
            order: dict[str, object] = {  # no weights: see _dispatch_bodies' docstring
                "id": f"o{i}",
                "created_at": NOW - int(rng.integers(0, 600_000)),
                "deadline": NOW + int(rng.integers(600_000, 7_200_000)),
            }
            if rng.random() < 0.15:
                order["address"] = str(rng.choice(_ADDRESSES))
            else:
                order["lat"] = round(39.9 + float(rng.normal(0, 0.05)), 5)
                order["lon"] = round(116.4 + float(rng.normal(0, 0.05)), 5)
            orders.append(order)
        couriers = [
            {
                "id": f"c{j}",
                "lat": round(39.9 + float(rng.normal(0, 0.05)), 5),
                "lon": round(116.4 + float(rng.normal(0, 0.05)), 5),
                "capacity": int(rng.integers(1, 6)),
            }
            for j in range(int(rng.integers(1, 8)))
        ]
        bodies.append(orjson.dumps({"orders": orders, "couriers": couriers, "now": NOW}))
    return bodies


def build_pools(reference_root: Path, size: int = 64) -> dict[str, list[tuple[bytes, object]]]:
    """Request bodies per route and the answer each should get (computed in this process).

    Raises:
        OrtServeError: a body of the pool the reference pipeline refuses (a bug in the
            generator above: every body must be answerable).
    """
    rng = np.random.default_rng(11)
    words = [entry.word for entry in load_corpus(reference_root / "hotword" / "1" / CORPUS)]
    bodies = {"predict": _hotword_bodies(rng, words, size), "route": _dispatch_bodies(rng, size)}

    async def answers() -> dict[str, list[tuple[bytes, object]]]:
        pools: dict[str, list[tuple[bytes, object]]] = {}
        async with pipeline_harness(reference_root) as harness:
            for kind, items in bodies.items():
                pools[kind] = [(body, await harness.post(ROUTES[kind], body)) for body in items]
        return pools

    return asyncio.run(answers())


def first_difference(expected: object, got: object, path: str = "") -> str:
    """Where ``got`` first differs from ``expected`` (for the soak's examples)."""
    if isinstance(expected, dict) and isinstance(got, dict):
        if expected.keys() != got.keys():
            return f"{path or '.'}: keys {sorted(expected)} vs {sorted(got)}"
        for key in expected:
            if not same_answer(expected[key], got[key]):
                return first_difference(expected[key], got[key], f"{path}.{key}")
    if isinstance(expected, list) and isinstance(got, list) and len(expected) == len(got):
        for index, (e, g) in enumerate(zip(expected, got, strict=True)):
            if not same_answer(e, g):
                return first_difference(e, g, f"{path}[{index}]")
    return f"{path or '.'}: expected {str(expected)[:100]}, got {str(got)[:100]}"


def same_answer(expected: object, got: object) -> bool:
    """Equal structure and text; numbers equal within :data:`_TOLERANCE` (absolute or relative)."""
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and expected.keys() == got.keys()
            and all(same_answer(expected[key], got[key]) for key in expected)
        )
    if isinstance(expected, list):
        return (
            isinstance(got, list)
            and len(expected) == len(got)
            and all(same_answer(e, g) for e, g in zip(expected, got, strict=True))
        )
    if isinstance(expected, bool) or not isinstance(expected, int | float):
        return type(expected) is type(got) and expected == got
    if isinstance(got, bool) or not isinstance(got, int | float):
        return False
    return math.isclose(expected, got, rel_tol=_TOLERANCE, abs_tol=_TOLERANCE)


class PipelineTraffic:
    """One paced client per route, each answer checked against its body's reference.

    Args:
        server: the soak's server.
        pools: :func:`build_pools`' result.
        record: the soak's bookkeeping (one record per request).
        refused_or_lost: how a non-200 status is recorded (429/503 refused, else lost).
        stop: set when the soak ends.
    """

    def __init__(
        self,
        server: ServerProcess,
        pools: dict[str, list[tuple[bytes, object]]],
        record: Record,
        refused_or_lost: RefusedOrLost,
        stop: threading.Event,
    ) -> None:
        self.server = server
        self.pools = pools
        self._record = record
        self._refused_or_lost = refused_or_lost
        self._stop = stop

    def workers(self) -> list[tuple[str, Callable[[str, int], None]]]:
        return [(kind, self._client) for kind in ROUTES]

    def _client(self, name: str, seed: int) -> None:
        """At most :data:`RATE_PER_S` requests a second: the routes' Python steps cost the
        server milliseconds each, and a closed loop of them would take most of its core from
        the model clients the rest of the soak measures."""
        rng = np.random.default_rng(seed)
        pool = self.pools[name]
        connection = CheckedConnection(self.server, name, self._record, self._refused_or_lost)
        started = time.monotonic()
        while not self._stop.wait(max(0.0, started + 1 / RATE_PER_S[name] - time.monotonic())):
            body, expected = pool[int(rng.integers(0, len(pool)))]
            started = time.monotonic()
            payload = connection.post(ROUTES[name], body, started)
            if payload is None:
                continue
            try:
                answer = orjson.loads(payload)
            except orjson.JSONDecodeError:
                answer = payload.decode(errors="replace")
            if same_answer(expected, answer):
                self._record(name, "ok", started)
            else:
                detail = f"{first_difference(expected, answer)} (body {body.decode()[:120]})"
                self._record(name, "wrong", started, detail=detail)
        connection.close()
