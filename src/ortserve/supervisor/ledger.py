"""The model control calls every worker must have applied, numbered, and how far each worker is.

With ``--workers N`` a load or unload is applied on every worker or on none. A call is
recorded with the next generation number once every worker that answered applied it; a worker
that could not be reached (killed, restarting) is behind, and is brought to the recorded state:
at its restart it replays the log (``worker.py``), and the gateway replays to it whatever it
still lacks before the next control call or index answer, so a worker restarted just before a
call was recorded catches up too. A call refused by a worker (a 4xx, say) is rolled back on
the workers that took it, or may have (no answer); a worker whose rollback fails is marked
as differing on that model and restored before the next control call or index answer. The
index reports a worker that has not converged yet.
"""

from __future__ import annotations

from ortserve.supervisor.plan import ControlCall, WorkerLaunch

__all__ = ["ControlLedger"]


class ControlLedger:
    """Per model, the last load or unload every worker must apply, and the generations.

    Args:
        launch: where the log and each worker's generation are kept (the private run folder).
    """

    def __init__(self, launch: WorkerLaunch) -> None:
        self._launch = launch
        self._calls: dict[str, ControlCall] = {}
        self.generation = 0
        """The number of the last call recorded (0: none)."""
        self._differing: dict[int, set[str]] = {}
        """Per worker, the models it may hold otherwise than recorded (a failed rollback)."""

    def record(self, model: str, path: str, body: bytes, headers: dict[bytes, bytes]) -> int:
        """Record a call applied on every worker that answered; returns its generation."""
        self.generation += 1
        self._calls.pop(model, None)
        self._calls[model] = (self.generation, path, body, dict(headers))
        self._launch.save_control_log(self.calls())
        return self.generation

    def calls(self) -> list[ControlCall]:
        """The recorded calls, oldest first (the latest per model)."""
        return sorted(self._calls.values(), key=lambda call: call[0])

    def previous(self, model: str) -> ControlCall | None:
        """The call that set ``model``'s current recorded state (None: its state at start)."""
        return self._calls.get(model)

    def applied(self, worker: int, generation: int) -> None:
        self._launch.save_generation(worker, generation)

    def behind(self, worker: int) -> list[ControlCall]:
        """The recorded calls worker ``worker`` has not applied yet, oldest first."""
        reached = self._launch.generation(worker)
        return [call for call in self.calls() if call[0] > reached]

    def reached(self, worker: int) -> int:
        return self._launch.generation(worker)

    def differs(self, worker: int, model: str) -> None:
        """Worker ``worker`` may hold ``model`` otherwise than recorded: restore it."""
        self._differing.setdefault(worker, set()).add(model)

    def restored(self, worker: int, model: str) -> None:
        """Worker ``worker`` holds ``model`` as recorded again."""
        models = self._differing.get(worker)
        if models is not None:
            models.discard(model)
            if not models:
                del self._differing[worker]

    def differing(self, worker: int) -> list[str]:
        """The models worker ``worker`` may hold otherwise than recorded, by name."""
        return sorted(self._differing.get(worker, ()))
