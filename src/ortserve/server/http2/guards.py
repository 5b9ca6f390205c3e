"""What a peer may make one connection do for nothing (ping, reset and settings floods), and
keepalive."""

from __future__ import annotations

from enum import Enum

__all__ = ["FrameBudget", "Keepalive", "KeepaliveStep", "PingStrikes"]


class PingStrikes:
    """gRPC's ping policy: a peer with no calls open may ping at most every ``interval_s``.

    Each ping sooner than that is a strike; more than ``max_strikes`` ends the connection
    (ENHANCE_YOUR_CALM, "too_many_pings"). Opening a call forgives every strike, as gRPC
    servers do, so a client that pings between calls is never punished.
    """

    def __init__(self, interval_s: float = 10.0, max_strikes: int = 2) -> None:
        self._interval_s = interval_s
        self._max_strikes = max_strikes
        self._last = -interval_s
        self._strikes = 0
        self.forgiven = True
        """No ping since the last :meth:`forgive`: forgiving again would change nothing (a call
        opening need not call it)."""

    def forgive(self) -> None:
        """A call opened."""
        self._strikes = 0
        self._last = -self._interval_s
        self.forgiven = True

    def ping(self, now: float, calls_open: bool) -> bool:
        """Record a ping at ``now``; True when the peer has struck out."""
        self.forgiven = False
        if not calls_open and now - self._last < self._interval_s:
            self._strikes += 1
        self._last = now
        return self._strikes > self._max_strikes


class FrameBudget:
    """A token bucket of frames a peer may make the connection work for, per kind.

    Stream resets, against "rapid reset" floods (CVE-2023-44487): every stream the peer resets,
    and every stream it makes the server reset, costs a token. SETTINGS frames, against
    settings floods (CVE-2019-9515): each one is answered with an ACK and may walk every open
    stream. Tokens come back at ``rate`` per second up to ``burst``; a peer that outruns the
    bucket loses the connection.
    """

    def __init__(self, rate: float = 1000.0, burst: float = 2000.0) -> None:
        self._rate = rate
        self._burst = burst
        self._tokens = burst
        self._refilled = 0.0

    def charge(self, now: float) -> bool:
        """Spend one token at ``now``; True when the budget is exhausted."""
        elapsed = now - self._refilled
        self._refilled = now
        self._tokens = min(self._burst, self._tokens + elapsed * self._rate) - 1
        return self._tokens < 0


class KeepaliveStep(Enum):
    PING = "ping"
    CLOSE = "close"
    WAIT = "wait"


class Keepalive:
    """When to ping a quiet peer, and when to give up on one that does not answer.

    Args:
        time_s: quiet seconds before a ping.
        timeout_s: seconds a ping may go unanswered.
    """

    def __init__(self, time_s: float, timeout_s: float) -> None:
        self._time_s = time_s
        self._timeout_s = timeout_s
        self._ping_sent_at: float | None = None

    def acknowledged(self) -> None:
        """The peer answered our ping."""
        self._ping_sent_at = None

    def step(self, now: float, last_read: float) -> tuple[KeepaliveStep, float]:
        """What to do at ``now`` (the peer last sent something at ``last_read``), and the
        seconds until the next check."""
        if self._ping_sent_at is not None:
            if now - self._ping_sent_at >= self._timeout_s:
                return KeepaliveStep.CLOSE, 0.0
            return KeepaliveStep.WAIT, self._timeout_s
        quiet = now - last_read
        if quiet >= self._time_s:
            self._ping_sent_at = now
            return KeepaliveStep.PING, self._timeout_s
        return KeepaliveStep.WAIT, self._time_s - quiet
