"""Model control for both transports: repository index, load, unload, model configuration.

The HTTP routes and the gRPC handlers only decode, call this, and encode, so both wires
refuse and answer alike. Load and unload are refused unless the control mode is ``explicit``
(Triton's behaviour, UNAVAILABLE).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

from ortserve.errors import ModelControlDisabled, OrtServeError
from ortserve.protocol.grpc import model_config_pb2 as mc
from ortserve.repository.effective_config import effective_config
from ortserve.repository.index import IndexRow, repository_index
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.override_parser import OverrideParser, shared_parser
from ortserve.repository.public_text import public_text

__all__ = ["ModelControl"]


class ModelControl:
    """What the repository extension and the model configuration API do.

    Args:
        manager: the server's lifecycle manager.
        mode: the model control mode (``none``, ``poll``, ``explicit``).
        parser: parses load requests' configurations (None: the process's shared one, whose
            child process starts on the first load that carries a configuration).
    """

    def __init__(self, manager: LifecycleManager, mode: str, parser: OverrideParser | None = None) -> None:
        self._manager = manager
        self._mode = mode
        self._parser = parser
        self.roles: Callable[[str], Mapping[str, str]] | None = None
        """Each model's traffic roles, named as the reason of its ready versions (routing)."""

    def index(self, ready_only: bool) -> list[IndexRow]:
        """The index, its reasons naming files relative to the repository.

        Raises: RepositoryError (the repository folder is gone).
        """
        root = self._manager.settings.model_repository
        rows = repository_index(self._manager.registry, root, ready_only, self.roles)
        return [replace(row, reason=public_text(row.reason, root)) for row in rows]

    async def index_view(self, ready_only: bool) -> list[IndexRow]:
        """The index as the server as a whole sees it (a worker of ``--workers N`` asks all).

        Raises: RepositoryError (the repository folder is gone).
        """
        return self.index(ready_only)

    async def load(self, name: str, config_json: str | None) -> None:
        """Load or reload ``name``; ``config_json`` (Triton JSON) replaces its config files.

        Raises:
            ModelControlDisabled, ModelNotFound, ConfigError, ModelLoadFailed.
        """
        self._check_explicit("load")
        override = None
        with self._public_errors():
            if config_json is not None:
                # In a child process, within limits: a request's configuration is parsed while
                # the event loop keeps serving (repository/override_parser.py).
                parser = self._parser or shared_parser()
                override = await parser.parse(config_json, name)
            await self._manager.load(name, override)

    async def unload(self, name: str, dependents: bool) -> None:
        """Raises: ModelControlDisabled, ModelNotFound."""
        self._check_explicit("unload")
        with self._public_errors():
            await self._manager.unload(name, dependents)

    def config(self, name: str, version: str | None) -> mc.ModelConfig:
        """The effective configuration of the version a request would reach.

        Raises:
            ModelNotFound, ModelNotReady.
        """
        registry = self._manager.registry
        served = registry.resolve(name, version)
        return effective_config(served.info, registry.entry(name).config)

    @contextlib.contextmanager
    def _public_errors(self) -> Iterator[None]:
        """Errors as a client may read them: files relative to the repository, no other path."""
        try:
            yield
        except OrtServeError as exc:
            exc.message = public_text(exc.message, self._manager.settings.model_repository)
            exc.args = (exc.message,)
            raise

    def _check_explicit(self, what: str) -> None:
        if self._mode != "explicit":
            raise ModelControlDisabled(
                f"explicit model {what} is not allowed: the model control mode is {self._mode!r} "
                "(start the server with --model-control-mode explicit)"
            )
