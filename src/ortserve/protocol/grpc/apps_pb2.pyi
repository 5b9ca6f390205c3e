from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PredictRequest(_message.Message):
    __slots__ = ("query", "region_id", "timestamp", "top_k", "user_id", "ab_tag")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    AB_TAG_FIELD_NUMBER: _ClassVar[int]
    query: str
    region_id: int
    timestamp: int
    top_k: int
    user_id: str
    ab_tag: str
    def __init__(self, query: _Optional[str] = ..., region_id: _Optional[int] = ..., timestamp: _Optional[int] = ..., top_k: _Optional[int] = ..., user_id: _Optional[str] = ..., ab_tag: _Optional[str] = ...) -> None: ...

class HotwordSuggestion(_message.Message):
    __slots__ = ("word", "score", "category", "tags", "tag_ids")
    WORD_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    TAG_IDS_FIELD_NUMBER: _ClassVar[int]
    word: str
    score: float
    category: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    tag_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, word: _Optional[str] = ..., score: _Optional[float] = ..., category: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., tag_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("matched", "hotwords", "model_version", "region_id")
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    HOTWORDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    matched: bool
    hotwords: _containers.RepeatedCompositeFieldContainer[HotwordSuggestion]
    model_version: str
    region_id: int
    def __init__(self, matched: _Optional[bool] = ..., hotwords: _Optional[_Iterable[_Union[HotwordSuggestion, _Mapping]]] = ..., model_version: _Optional[str] = ..., region_id: _Optional[int] = ...) -> None: ...

class Order(_message.Message):
    __slots__ = ("id", "lat", "lon", "address", "created_at", "deadline", "weight", "value")
    ID_FIELD_NUMBER: _ClassVar[int]
    LAT_FIELD_NUMBER: _ClassVar[int]
    LON_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    id: str
    lat: float
    lon: float
    address: str
    created_at: int
    deadline: int
    weight: float
    value: float
    def __init__(self, id: _Optional[str] = ..., lat: _Optional[float] = ..., lon: _Optional[float] = ..., address: _Optional[str] = ..., created_at: _Optional[int] = ..., deadline: _Optional[int] = ..., weight: _Optional[float] = ..., value: _Optional[float] = ...) -> None: ...

class Courier(_message.Message):
    __slots__ = ("id", "lat", "lon", "capacity", "load")
    ID_FIELD_NUMBER: _ClassVar[int]
    LAT_FIELD_NUMBER: _ClassVar[int]
    LON_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    id: str
    lat: float
    lon: float
    capacity: float
    load: float
    def __init__(self, id: _Optional[str] = ..., lat: _Optional[float] = ..., lon: _Optional[float] = ..., capacity: _Optional[float] = ..., load: _Optional[float] = ...) -> None: ...

class RouteRequest(_message.Message):
    __slots__ = ("orders", "couriers", "now", "top_k", "min_on_time", "coord_system", "pareto", "user_id", "ab_tag", "constraints")
    ORDERS_FIELD_NUMBER: _ClassVar[int]
    COURIERS_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_ON_TIME_FIELD_NUMBER: _ClassVar[int]
    COORD_SYSTEM_FIELD_NUMBER: _ClassVar[int]
    PARETO_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    AB_TAG_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    orders: _containers.RepeatedCompositeFieldContainer[Order]
    couriers: _containers.RepeatedCompositeFieldContainer[Courier]
    now: int
    top_k: int
    min_on_time: float
    coord_system: str
    pareto: str
    user_id: str
    ab_tag: str
    constraints: _containers.RepeatedCompositeFieldContainer[Constraint]
    def __init__(self, orders: _Optional[_Iterable[_Union[Order, _Mapping]]] = ..., couriers: _Optional[_Iterable[_Union[Courier, _Mapping]]] = ..., now: _Optional[int] = ..., top_k: _Optional[int] = ..., min_on_time: _Optional[float] = ..., coord_system: _Optional[str] = ..., pareto: _Optional[str] = ..., user_id: _Optional[str] = ..., ab_tag: _Optional[str] = ..., constraints: _Optional[_Iterable[_Union[Constraint, _Mapping]]] = ...) -> None: ...

class Point(_message.Message):
    __slots__ = ("lat", "lon")
    LAT_FIELD_NUMBER: _ClassVar[int]
    LON_FIELD_NUMBER: _ClassVar[int]
    lat: float
    lon: float
    def __init__(self, lat: _Optional[float] = ..., lon: _Optional[float] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("kind", "name", "start", "end", "speed_factor", "polygon", "walk_minutes", "forbidden")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    SPEED_FACTOR_FIELD_NUMBER: _ClassVar[int]
    POLYGON_FIELD_NUMBER: _ClassVar[int]
    WALK_MINUTES_FIELD_NUMBER: _ClassVar[int]
    FORBIDDEN_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    start: str
    end: str
    speed_factor: float
    polygon: _containers.RepeatedCompositeFieldContainer[Point]
    walk_minutes: float
    forbidden: bool
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., start: _Optional[str] = ..., end: _Optional[str] = ..., speed_factor: _Optional[float] = ..., polygon: _Optional[_Iterable[_Union[Point, _Mapping]]] = ..., walk_minutes: _Optional[float] = ..., forbidden: _Optional[bool] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("courier_id", "score", "on_time", "distance_km", "pareto")
    COURIER_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    ON_TIME_FIELD_NUMBER: _ClassVar[int]
    DISTANCE_KM_FIELD_NUMBER: _ClassVar[int]
    PARETO_FIELD_NUMBER: _ClassVar[int]
    courier_id: str
    score: float
    on_time: float
    distance_km: float
    pareto: bool
    def __init__(self, courier_id: _Optional[str] = ..., score: _Optional[float] = ..., on_time: _Optional[float] = ..., distance_km: _Optional[float] = ..., pareto: _Optional[bool] = ...) -> None: ...

class OrderAnswer(_message.Message):
    __slots__ = ("order_id", "courier_id", "candidates", "placed_in", "placed_by", "city", "road", "number", "precision", "ignored_fields", "uncertainty_km", "constraints")
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    COURIER_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    PLACED_IN_FIELD_NUMBER: _ClassVar[int]
    PLACED_BY_FIELD_NUMBER: _ClassVar[int]
    CITY_FIELD_NUMBER: _ClassVar[int]
    ROAD_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    IGNORED_FIELDS_FIELD_NUMBER: _ClassVar[int]
    UNCERTAINTY_KM_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    order_id: str
    courier_id: str
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    placed_in: str
    placed_by: str
    city: str
    road: str
    number: str
    precision: str
    ignored_fields: _containers.RepeatedScalarFieldContainer[str]
    uncertainty_km: float
    constraints: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, order_id: _Optional[str] = ..., courier_id: _Optional[str] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., placed_in: _Optional[str] = ..., placed_by: _Optional[str] = ..., city: _Optional[str] = ..., road: _Optional[str] = ..., number: _Optional[str] = ..., precision: _Optional[str] = ..., ignored_fields: _Optional[_Iterable[str]] = ..., uncertainty_km: _Optional[float] = ..., constraints: _Optional[_Iterable[str]] = ...) -> None: ...

class Unassigned(_message.Message):
    __slots__ = ("order_id", "reason")
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    order_id: str
    reason: str
    def __init__(self, order_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Solver(_message.Message):
    __slots__ = ("method", "optimal")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    OPTIMAL_FIELD_NUMBER: _ClassVar[int]
    method: str
    optimal: bool
    def __init__(self, method: _Optional[str] = ..., optimal: _Optional[bool] = ...) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("orders", "unassigned", "now", "model_version", "solver")
    ORDERS_FIELD_NUMBER: _ClassVar[int]
    UNASSIGNED_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SOLVER_FIELD_NUMBER: _ClassVar[int]
    orders: _containers.RepeatedCompositeFieldContainer[OrderAnswer]
    unassigned: _containers.RepeatedCompositeFieldContainer[Unassigned]
    now: int
    model_version: str
    solver: Solver
    def __init__(self, orders: _Optional[_Iterable[_Union[OrderAnswer, _Mapping]]] = ..., unassigned: _Optional[_Iterable[_Union[Unassigned, _Mapping]]] = ..., now: _Optional[int] = ..., model_version: _Optional[str] = ..., solver: _Optional[_Union[Solver, _Mapping]] = ...) -> None: ...
