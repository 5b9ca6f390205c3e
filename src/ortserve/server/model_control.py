"""Model control for both transports: repository index, load, unload, model configuration.

The HTTP routes and the gRPC handlers only decode, call this, and encode, so both wires
refuse and answer alike. Load and unload are refused unless the control mode is ``explicit``
(Triton's behaviour, UNAVAILABLE).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

import orjson
from google.protobuf import json_format

from ortserve.config.bounded import bounded_text, check_json
from ortserve.errors import ConfigError, ModelControlDisabled, OrtServeError
from ortserve.protocol.grpc import model_config_pb2 as mc
from ortserve.repository.config_source import ModelSource
from ortserve.repository.effective_config import effective_config
from ortserve.repository.index import IndexRow, repository_index
from ortserve.repository.manager import LifecycleManager
from ortserve.repository.public_text import public_text
from ortserve.repository.triton_config import to_model_config

__all__ = ["ModelControl"]


class ModelControl:
    """What the repository extension and the model configuration API do.

    Args:
        manager: the server's lifecycle manager.
        mode: the model control mode (``none``, ``poll``, ``explicit``).
    """

    def __init__(self, manager: LifecycleManager, mode: str) -> None:
        self._manager = manager
        self._mode = mode
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
                # In a worker thread, within limits: a request's configuration is parsed while
                # the event loop keeps serving (config/bounded.py).
                override = await asyncio.to_thread(_parse_override, config_json, name)
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


_FILE_WORDS = ("path", "dir", "file")


def _parse_override(config_json: str, name: str) -> ModelSource:
    """A load request's configuration, measured before it is parsed (runs in a worker thread).

    Raises:
        ConfigError: past the limits, not a configuration, or a provider option naming a file.
    """
    check_json(config_json, "parameters.config")
    try:
        triton = to_model_config(_message(config_json), "parameters.config", name)
    except RecursionError:  # the limits keep nesting far below the interpreter's; never a 500
        raise ConfigError("parameters.config: nested too deeply") from None
    override = ModelSource.from_triton(triton, "parameters.config")
    _refuse_file_options(override)
    return override


_LONG_STRING = 4096


def _message(config_json: str) -> mc.ModelConfig:
    """Triton JSON as a ModelConfig message, long string parameters (the YAML documents of
    ``ortserve.*``) set after the JSON parse: protobuf's JSON parser scans every string with a
    regular expression for lone surrogates while holding the GIL (1 MB: 85 ms during which no
    client was answered). orjson has already refused invalid UTF-8 and lone surrogates.

    Raises:
        ConfigError: not a JSON ModelConfig.
    """
    document = orjson.loads(config_json)  # measured by check_json: within the limits
    parameters = document.get("parameters") if isinstance(document, dict) else None
    long: dict[str, str] = {}
    if isinstance(parameters, dict):
        for key, value in list(parameters.items()):
            text = value.get("string_value") if isinstance(value, dict) and len(value) == 1 else None
            if isinstance(text, str) and len(text) > _LONG_STRING:
                long[key] = text
                del parameters[key]
    message = mc.ModelConfig()
    try:
        json_format.ParseDict(document, message)
        for key, text in long.items():
            message.parameters[key].string_value = text
    except (json_format.ParseError, ValueError, TypeError) as exc:
        problem = bounded_text(str(exc), 300)
        raise ConfigError(f"parameters.config: not a model configuration: {problem}") from None
    return message


def _refuse_file_options(source: ModelSource) -> None:
    """A load request's config may not name files for a provider to write (TensorRT's engine
    and timing caches, say): whoever reaches the control API would choose where the server
    writes. The repository's own config files may; they are the operator's.

    Raises:
        ConfigError: a provider option whose name says it is a path, directory or file.
    """
    for provider in source.config.providers or ():
        if isinstance(provider, str):
            continue
        for key in provider.options:
            if any(word in key.lower() for word in _FILE_WORDS):
                raise ConfigError(
                    f"parameters.config: provider {provider.name} option {key!r} names a file; "
                    "set it in the model's config file, not in a load request"
                )
