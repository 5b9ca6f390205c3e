"""Which connection makes room at the cap (idle first, then the least progress, never one
serving a whole request), and the per-peer limit, on fakes and a hand-moved clock."""

from __future__ import annotations

from dataclasses import dataclass, field

from ortserve.server.connection_limit import ConnectionLimit


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(eq=False)
class Fake:
    """A connection: it counts the bytes it receives and leaves the limit when evicted."""

    limit: ConnectionLimit
    name: str
    received: int = 0
    evicted: bool = False
    log: list[str] = field(default_factory=list)

    def evict(self) -> None:
        self.evicted = True
        self.log.append(self.name)
        self.limit.leave(self)


def full(maximum: int, clock: Clock | None = None) -> tuple[ConnectionLimit, list[Fake], list[str]]:
    """A limit at its cap, with ``maximum`` fakes admitted (all serving to begin with)."""
    limit = ConnectionLimit(maximum, clock=clock or Clock())
    log: list[str] = []
    fakes = []
    for i in range(maximum):
        assert limit.admit()
        fakes.append(Fake(limit, f"c{i}", log=log))
    return limit, fakes, log


def test_an_idle_connection_makes_room_before_one_whose_request_is_arriving() -> None:
    limit, (arriving, idle), log = full(2)
    limit.receiving(arriving)
    limit.idle(idle)
    assert limit.admit() and log == ["c1"]
    assert limit.admit() and log == ["c1", "c0"]
    assert not limit.admit() and limit.refused == 1  # nothing left that may make room


def test_the_arriving_request_with_the_fewest_bytes_per_second_makes_room() -> None:
    clock = Clock()
    limit, (fast, trickle, silent), log = full(3, clock)
    for fake in (fast, trickle, silent):
        fake.received = 300  # each sent its head: the rate counts from then on
        limit.receiving(fake)
    clock.now = 9.0
    fast.received += 5_000_000
    trickle.received += 600 * 9  # 600 B/s: above any minimum rate, still the slowest but one
    assert limit.admit() and log == ["c2"]
    assert limit.admit() and log == ["c2", "c1"]
    assert limit.admit() and log == ["c2", "c1", "c0"]


def test_a_connection_serving_a_whole_request_never_makes_room() -> None:
    limit, (serving, arriving), log = full(2)
    limit.receiving(serving)
    limit.busy(serving)  # its request came in whole: it is being answered
    limit.receiving(arriving)
    assert limit.admit() and log == ["c1"]
    assert not limit.admit() and not serving.evicted


def test_a_request_that_began_again_is_judged_from_its_new_start() -> None:
    clock = Clock()
    limit, (old, new), log = full(2, clock)
    limit.receiving(old)
    clock.now = 100.0
    old.received = 50_000  # 500 B/s over its 100 s
    limit.idle(old)
    limit.receiving(old)  # a new request on the same connection: 0 bytes since
    limit.receiving(new)
    new.received = 10
    assert limit.admit() and log == ["c0"]


def test_only_the_oldest_few_are_compared_and_the_spared_go_to_the_back() -> None:
    clock = Clock()
    limit, fakes, log = full(20, clock)
    for fake in fakes:
        limit.receiving(fake)
    clock.now = 10.0
    for fake in fakes[:8]:
        fake.received = 1_000_000  # the eight oldest are fast
    fakes[19].received = 0  # the newest is silent, but not among the eight compared first
    fakes[18].received = 0
    assert limit.admit() and log == ["c0"]  # the slowest of the eight (all equal: the oldest)
    for fake in fakes[8:18]:
        fake.received = 500_000
    assert limit.admit()  # c1..c7 went to the back: now c8..c15 are compared
    assert log[-1] == "c8"


def test_a_peer_holds_at_most_its_share_and_gets_it_back_as_connections_leave() -> None:
    limit = ConnectionLimit(100, per_peer=2)
    first, second, third = (object() for _ in range(3))
    assert limit.join_peer(first, "10.0.0.1") and limit.join_peer(second, "10.0.0.1")
    assert not limit.join_peer(third, "10.0.0.1") and limit.refused_peer == 1
    assert limit.join_peer(third, "10.0.0.2")
    assert limit.join_peer(object(), "")  # a Unix socket has no address to count against
    limit.admit()
    limit.leave(first)
    assert limit.join_peer(object(), "10.0.0.1")


def test_without_a_per_peer_limit_nothing_is_counted() -> None:
    limit = ConnectionLimit(100)
    assert all(limit.join_peer(object(), "10.0.0.1") for _ in range(500))
