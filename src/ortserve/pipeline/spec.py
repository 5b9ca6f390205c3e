"""Resolving ``pipeline:`` in a model's config to a class that implements the pipeline contract.

The spec is checked before anything it names is called: a repository file must not be able to
make the server call ``os:system`` or any other callable at load. Accepted are the built-in
short names, the names of entry points in the ``ortserve.pipelines`` group (what an installed
package registers), and ``package.module:Class`` outside the standard library whose target is a
class with the contract's steps.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, cast

from ortserve.errors import ConfigError
from ortserve.pipeline.contract import Pipeline, PipelineContext

__all__ = ["BUILTIN_PIPELINES", "ENTRY_POINT_GROUP", "Factory", "import_pipeline"]

BUILTIN_PIPELINES = {
    "hotword": "ortserve.apps.hotword.pipeline:HotwordPipeline",
    "dispatch": "ortserve.apps.dispatch.pipeline:DispatchPipeline",
}
ENTRY_POINT_GROUP = "ortserve.pipelines"
"""Packages register pipelines here: ``[project.entry-points."ortserve.pipelines"]``."""
CONTRACT_STEPS = ("parse", "preprocess", "postprocess", "example")

Factory = Callable[[PipelineContext], Pipeline[Any]]


def import_pipeline(spec: str) -> Factory:
    """The pipeline class ``spec`` names: a built-in, an entry point, or ``package.module:Class``.

    Raises:
        ConfigError: the spec is malformed, names the standard library, cannot be imported, or
            names something that is not a class with the pipeline's steps.
    """
    target = BUILTIN_PIPELINES.get(spec) or _registered(spec) or spec
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigError(
            f"field pipeline: {spec!r} is not 'package.module:Class', a built-in name "
            f"({', '.join(BUILTIN_PIPELINES)}) or an entry point of group {ENTRY_POINT_GROUP!r}"
        )
    if module_name.partition(".")[0] in sys.stdlib_module_names:
        raise ConfigError(f"field pipeline: {module_name!r} is the standard library, not a pipeline")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"field pipeline: cannot import {module_name!r}: {exc}") from exc
    factory = getattr(module, attribute, None)
    if factory is None:
        raise ConfigError(f"field pipeline: {module_name!r} has no class {attribute!r}")
    _check_contract(target, factory)
    return cast(Factory, factory)


def _registered(name: str) -> str | None:
    found = entry_points(group=ENTRY_POINT_GROUP, name=name)
    return next((point.value for point in found), None)


def _check_contract(target: str, factory: object) -> None:
    if not inspect.isclass(factory):
        raise ConfigError(f"field pipeline: {target!r} is not a class (a pipeline is a class)")
    missing = [step for step in CONTRACT_STEPS if not callable(getattr(factory, step, None))]
    if missing:
        raise ConfigError(
            f"field pipeline: class {target!r} does not implement the pipeline contract "
            f"(missing {', '.join(missing)})"
        )
