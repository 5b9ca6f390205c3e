"""The dispatch pipeline: pair features, one batched scoring call, top-K and capacity decoding."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ortserve.apps.dispatch.decoding import decode
from ortserve.apps.dispatch.features import PairFeatures, pair_features
from ortserve.apps.dispatch.request import DispatchRequest, Order, parse_dispatch_request
from ortserve.apps.dispatch.training import INPUT, OUTPUT
from ortserve.pipeline.contract import JsonObject, ModelCall, ModelOutputs, PipelineContext

__all__ = ["DispatchPipeline"]


class _Prepared:
    """A request and its pair features, carried from preprocess to postprocess."""

    __slots__ = ("features", "request")

    def __init__(self, request: DispatchRequest) -> None:
        self.request = request
        self.features: PairFeatures | None = None


class DispatchPipeline:
    """``POST /v1/route``: orders and couriers in; per order the courier and top-K candidates.

    Args:
        context: the ``dispatch`` scorer model this pipeline calls.
    """

    route = "/v1/route"

    def __init__(self, context: PipelineContext) -> None:
        self._model = context.model_name
        self._version = context.model_version

    def parse(self, document: object) -> _Prepared:
        return _Prepared(parse_dispatch_request(document))

    def preprocess(self, prepared: _Prepared) -> list[ModelCall]:
        prepared.features = pair_features(prepared.request)
        return [ModelCall(self._model, {INPUT: prepared.features.rows})]

    def postprocess(self, outputs: Sequence[ModelOutputs], prepared: _Prepared) -> JsonObject:
        request, features = prepared.request, prepared.features
        assert features is not None  # preprocess always ran first
        shape = (len(request.orders), len(request.couriers))
        scores = np.asarray(outputs[0][OUTPUT], dtype=np.float32)
        score, on_time = scores[:, 0].reshape(shape), scores[:, 1].reshape(shape)
        courier_ids = [c.id for c in request.couriers]
        result = decode(
            score,
            on_time,
            features.fits,
            [o.weight for o in request.orders],
            [c.capacity - c.load for c in request.couriers],
            [o.id for o in request.orders],
            courier_ids,
            request.top_k,
        )
        rounded = (
            np.round(score.astype(np.float64), 4).tolist(),  # float64: 0.9146, not 0.91460001
            np.round(on_time.astype(np.float64), 4).tolist(),
            np.round(features.distance_km, 3).tolist(),
        )
        orders = [
            self._order_answer(
                order, result.courier[o], result.candidates[o], [r[o] for r in rounded], courier_ids
            )
            for o, order in enumerate(request.orders)
        ]
        unassigned = [
            {"order_id": request.orders[o].id, "reason": reason}
            for o, reason in enumerate(result.reason)
            if reason is not None
        ]
        return {"orders": orders, "unassigned": unassigned, "model_version": self._version}

    @staticmethod
    def _order_answer(
        order: Order, chosen: int, candidates: list[int], rounded: list[list[float]], courier_ids: list[str]
    ) -> JsonObject:
        score, on_time, distance = rounded
        answer: JsonObject = {
            "order_id": order.id,
            "courier_id": courier_ids[chosen] if chosen >= 0 else None,
            "candidates": [
                {
                    "courier_id": courier_ids[c],
                    "score": score[c],
                    "on_time": on_time[c],
                    "distance_km": distance[c],
                }
                for c in candidates
            ],
        }
        if order.placed_by:
            answer["placed_in"] = order.placed_by
        return answer

    def example(self) -> JsonObject:
        now = 1_759_017_600_000
        return {
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
