"""The dispatch pipeline: pair features, one batched scoring call, top-K and capacity decoding."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence

import numpy as np

from ortserve.apps.dispatch.decoding import Assignment, PairScores, decode
from ortserve.apps.dispatch.features import PairFeatures, pair_features
from ortserve.apps.dispatch.geocoder import GeocoderHook
from ortserve.apps.dispatch.request import DispatchRequest, Order, parse_dispatch_request
from ortserve.apps.dispatch.training import INPUT, OUTPUT, SCORE_COLUMNS
from ortserve.pipeline.contract import JsonObject, ModelCall, ModelOutputs, PipelineContext

__all__ = ["DispatchPipeline", "GeocodingDispatchPipeline"]


class _Prepared:
    """A request and its pair features, carried from preprocess to postprocess."""

    __slots__ = ("features", "request")

    def __init__(self, request: DispatchRequest) -> None:
        self.request = request
        self.features: PairFeatures | None = None


def _pair_scores(scores: np.ndarray, features: PairFeatures, request: DispatchRequest) -> PairScores:
    """The scorer's columns as [orders, couriers] float64 arrays (float64 rounds 0.9146 as such)."""
    shape = (len(request.orders), len(request.couriers))
    column = {name: scores[:, i].astype(np.float64).reshape(shape) for i, name in enumerate(SCORE_COLUMNS)}
    return PairScores(
        column["score"], column["on_time"], features.distance_km, column["load_balance"], features.fits
    )


def _candidates(
    pairs: PairScores, features: PairFeatures, result: Assignment, courier_ids: list[str]
) -> list[list[JsonObject]]:
    """Each order's candidates with their rounded figures, gathered only where listed (a
    500 x 200 request lists 2,500 of 100,000 pairs)."""
    orders = [o for o, picks in enumerate(result.candidates) for _ in picks]
    couriers = [c for picks in result.candidates for c in picks]
    score = np.round(pairs.score[orders, couriers], 4).tolist()
    on_time = np.round(pairs.on_time[orders, couriers], 4).tolist()
    distance = np.round(features.distance_km[orders, couriers], 3).tolist()
    marks = [m for row in result.pareto for m in row]
    figures = iter(zip(couriers, score, on_time, distance, marks, strict=True))
    return [
        [
            {"courier_id": courier_ids[c], "score": s, "on_time": t, "distance_km": d, "pareto": m}
            for c, s, t, d, m in itertools.islice(figures, len(picks))
        ]
        for picks in result.candidates
    ]


def _filtered(
    candidates: list[JsonObject], chosen: int, courier_ids: list[str], request: DispatchRequest
) -> list[JsonObject]:
    """With ``pareto: "filter"``, only the candidates on the order's Pareto front, and the
    assigned courier whatever its mark (capacity may have forced a dominated one)."""
    if not request.pareto_filter:
        return candidates
    assigned = courier_ids[chosen] if chosen >= 0 else None
    return [c for c in candidates if c["pareto"] or c["courier_id"] == assigned]


INLINE_PAIRS = 64
"""A unit-weight instance of at most this many order-courier pairs is answered on the event
loop (its assignment takes microseconds: a thread hop would cost more); anything larger, or
with unequal weights, in a worker thread."""


def _solves_quickly(request: DispatchRequest) -> bool:
    pairs = len(request.orders) * len(request.couriers)
    return pairs <= INLINE_PAIRS and all(o.weight == 1 for o in request.orders)


class _DispatchSteps:
    """The steps both dispatch pipelines share: parse, features, postprocess, example.

    Args:
        context: the ``dispatch`` scorer model this pipeline calls.
        clock: Unix time in seconds, read when a request has no ``now`` (injectable for tests).
    """

    route: str | None = "/v1/route"

    def __init__(self, context: PipelineContext, clock: Callable[[], float] = time.time) -> None:
        self._model = context.model_name
        self._version = context.model_version
        self._clock = clock

    def parse(self, document: object) -> _Prepared:
        return _Prepared(parse_dispatch_request(document, int(self._clock() * 1000)))

    def _score_all(self, prepared: _Prepared) -> list[ModelCall]:
        if not prepared.request.orders:
            return []
        prepared.features = pair_features(prepared.request)
        return [ModelCall(self._model, {INPUT: prepared.features.rows})]

    async def postprocess(self, outputs: Sequence[ModelOutputs], prepared: _Prepared) -> JsonObject:
        """The answer, computed on the event loop only for a tiny unit-weight instance.

        The assignment is an optimisation whose time grows with the instance (50 x 20 orders
        and couriers: milliseconds; unequal weights: a MIP that may use its whole 1 s budget),
        while the pipeline runtime plans this step from the small example alone. Run on the
        loop, one large request stalled every client of the server for up to a second (the
        soak's p99 was 1.02 s on every transport). HiGHS and the assignment release the GIL,
        so in a worker thread they leave the loop serving.
        """
        if _solves_quickly(prepared.request):
            return self.answer(outputs, prepared)
        return await asyncio.to_thread(self.answer, outputs, prepared)

    def answer(self, outputs: Sequence[ModelOutputs], prepared: _Prepared) -> JsonObject:
        """The answer to ``prepared`` given the scorer's outputs (on the calling thread)."""
        request, features = prepared.request, prepared.features
        rejected = [{"order_id": r.id, "reason": r.reason} for r in request.rejected]
        answer: JsonObject = {"orders": [], "unassigned": rejected, "now": request.now}
        answer["model_version"] = self._version
        if features is None:
            return answer
        pairs = _pair_scores(np.asarray(outputs[0][OUTPUT]), features, request)
        courier_ids = [c.id for c in request.couriers]
        result = decode(
            pairs,
            [o.weight for o in request.orders],
            [c.capacity - c.load for c in request.couriers],
            [o.deadline <= request.now for o in request.orders],
            [o.id for o in request.orders],
            courier_ids,
            request.top_k,
            request.min_on_time,
            values=[o.value for o in request.orders] if any(o.value != 1.0 for o in request.orders) else None,
            blocked=list(features.blocked) or None,
        )
        answer["orders"] = [
            self._order_answer(
                order,
                result.courier[o],
                _filtered(candidates, result.courier[o], courier_ids, request),
                courier_ids,
                features.applied[o] if features.applied else (),
            )
            for o, (order, candidates) in enumerate(
                zip(request.orders, _candidates(pairs, features, result, courier_ids), strict=True)
            )
        ]
        answer["unassigned"] = rejected + [
            {"order_id": request.orders[o].id, "reason": reason}
            for o, reason in enumerate(result.reason)
            if reason is not None
        ]
        answer["solver"] = {"method": result.method, "optimal": result.optimal}
        return answer

    @staticmethod
    def _order_answer(
        order: Order,
        chosen: int,
        candidates: list[JsonObject],
        courier_ids: list[str],
        constraints: tuple[str, ...],
    ) -> JsonObject:
        answer: JsonObject = {
            "order_id": order.id,
            "courier_id": courier_ids[chosen] if chosen >= 0 else None,
            "candidates": candidates,
        }
        if constraints:
            answer["constraints"] = list(constraints)
        if order.ignored:
            answer["ignored_fields"] = list(order.ignored)
        if order.placed_by:
            answer["placed_in"] = order.placed_by
        if order.place is not None and not order.geocoded:
            answer["city"] = order.place.city
        if order.placed_by or order.geocoded:
            answer["placed_by"] = "geocoder" if order.geocoded else "gazetteer"
        if order.place is not None:
            if order.place.road is not None:
                answer["road"] = order.place.road
            if order.place.number is not None:
                answer["number"] = order.place.number
            if not order.geocoded:
                answer["precision"] = order.place.precision
                answer["uncertainty_km"] = order.place.uncertainty_km
        return answer

    def example(self) -> JsonObject:
        now = 1_759_017_600_000
        return {
            "now": now,
            "orders": [
                {"id": "o1", "lat": 39.9219, "lon": 116.4436, "created_at": now, "deadline": now + 1_800_000},
                {
                    "id": "o2",
                    "address": "北京市海淀区中关村大街1号",
                    "created_at": now,
                    "deadline": now + 3_600_000,
                },
            ],
            "couriers": [
                {"id": "c1", "lat": 39.92, "lon": 116.44, "capacity": 5, "load": 1},
                {"id": "c2", "lat": 39.96, "lon": 116.30, "capacity": 3},
            ],
        }


class DispatchPipeline(_DispatchSteps):
    """``POST /v1/route``: orders and couriers in; per order the courier and top-K candidates.
    Addresses are placed by the gazetteer's rules."""

    def preprocess(self, prepared: _Prepared) -> list[ModelCall]:
        return self._score_all(prepared)


class GeocodingDispatchPipeline(_DispatchSteps):
    """The dispatch pipeline with a geocoding service for addresses (see
    ``ortserve.apps.dispatch.geocoder``): each order given by address is looked up
    concurrently; where the service answers in time its position replaces the rules'.

    Args:
        context: the ``dispatch`` scorer model this pipeline calls.
        geocoder: the service behind its timeout and cache.
        clock: as for :class:`DispatchPipeline`.
    """

    def __init__(
        self, context: PipelineContext, geocoder: GeocoderHook, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(context, clock)
        self._geocoder = geocoder

    async def preprocess(self, prepared: _Prepared) -> list[ModelCall]:
        """Orders the gazetteer placed are refined, and orders it could not place are asked
        for before being declared unplaceable (those the service places are appended)."""
        request = prepared.request
        pending = [r.pending for r in request.rejected if r.pending is not None]
        by_address = [o for o in (*request.orders, *pending) if o.address is not None]
        if by_address:
            found = await asyncio.gather(*(self._geocoder.locate(o.address or "") for o in by_address))
            located = {o.id: at for o, at in zip(by_address, found, strict=True) if at is not None}
            orders = tuple(
                dataclasses.replace(o, lat=located[o.id][0], lon=located[o.id][1], geocoded=True)
                if o.id in located
                else o
                for o in (*request.orders, *(p for p in pending if p.id in located))
            )
            rejected = tuple(r for r in request.rejected if r.id not in located)
            prepared.request = dataclasses.replace(request, orders=orders, rejected=rejected)
        return self._score_all(prepared)
