"""Turning an LLM version folder into a running LlmVersion: files, session, checks, warm-up."""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from ortserve.config.model import ModelConfig
from ortserve.core.heap import malloc_trim
from ortserve.core.model_files import ModelFiles, read_model_files
from ortserve.core.session import build_session, plan_session
from ortserve.llm.device_kv import with_cuda_graph
from ortserve.llm.engine import DecoderSession, EngineLimits, GenerationEngine
from ortserve.llm.fusion import step_session
from ortserve.llm.layout import LlmFiles, check_graph, read_llm_files
from ortserve.llm.prefix_cache import PrefixCache
from ortserve.llm.sequence import GenerationEvent, Sequence
from ortserve.llm.servable import LlmVersion, llm_info
from ortserve.llm.tokenizer import TextTokenizer
from ortserve.settings import ServerSettings

__all__ = ["SMALL_FILE_BYTES", "VerifiedFiles", "load_llm_version"]

logger = logging.getLogger(__name__)

_DEFAULT_MAX_TOKENS = 256
SMALL_FILE_BYTES = 64 << 20
"""Files up to this size are kept as verified for an LLM (a tokenizer.json is 2-30 MB)."""


@dataclass(frozen=True, slots=True)
class VerifiedFiles:
    """An LLM version's files as its signature check read them: the graph with its external
    data, and the small files (config, generation config, tokenizer) by relative path."""

    model: ModelFiles
    small: Mapping[str, bytes]


@dataclass(slots=True)
class _Prepared:
    files: LlmFiles
    decoder: DecoderSession
    tokenizer: TextTokenizer
    providers: tuple[str, ...]


def _signature(args: list[ort.NodeArg]) -> dict[str, tuple[str, list[object]]]:
    return {a.name: (a.type, list(a.shape)) for a in args}


def _prepare(
    path: Path, config: ModelConfig, settings: ServerSettings, verified: VerifiedFiles | None
) -> _Prepared:
    if verified is None:
        files = read_llm_files(path.parent)
        tokenizer = TextTokenizer(path.parent, files.tokenizer_config)
    else:
        files, tokenizer = _read_verified(verified)
    plan = plan_session(config, settings.intra_op_threads, settings.inter_op_threads)
    plan = with_cuda_graph(plan, config.llm.enable_cuda_graph)  # into the CUDA provider's options
    model = read_model_files(path) if verified is None else verified.model
    session = build_session(path, plan, files=model)
    layout = check_graph(files, _signature(session.get_inputs()), _signature(session.get_outputs()))
    decoder = DecoderSession(session, layout)
    providers = tuple(session.get_providers())
    if config.llm.fuse_steps and layout.shared_buffer and providers[0] == "CPUExecutionProvider":
        # From the very bytes the plain session was built from (and the signature checked).
        decoder.fused = step_session(
            decoder, model.graph, files.config, lambda graph: build_session(path, plan, model_bytes=graph)
        )
        if malloc_trim is not None:  # the graph's parse, weights and rebuild: ~4 copies, now free
            malloc_trim()
    return _Prepared(files, decoder, tokenizer, providers)


def _read_verified(verified: VerifiedFiles) -> tuple[LlmFiles, TextTokenizer]:
    """Config and tokenizer from the bytes whose signature was checked, not the folder again:
    they are written to a private folder (mode 0700, the server's own) and read from there."""
    with tempfile.TemporaryDirectory(prefix="ortserve-llm-") as private:
        root = Path(private)
        for name, data in verified.small.items():
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        files = read_llm_files(root)
        return files, TextTokenizer(root, files.tokenizer_config)


def _default_max_tokens(files: LlmFiles, config: ModelConfig) -> int:
    if config.llm.default_max_tokens is not None:
        return config.llm.default_max_tokens
    value = files.generation.get("max_new_tokens")
    return value if isinstance(value, int) and value > 0 else _DEFAULT_MAX_TOKENS


async def load_llm_version(
    name: str,
    version: int,
    path: Path,
    config: ModelConfig,
    settings: ServerSettings,
    verified: VerifiedFiles | None = None,
) -> LlmVersion:
    """Check and load the version in a worker thread, warm it up, start its decode thread.

    ``verified``: the files as the signature check read them (None: read from the folder).

    Raises:
        ConfigError: a missing file or a graph outside the Optimum decoder layout (the reason).
        Exception: what ONNX Runtime raises for an unloadable model.
    """
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    prepared = await asyncio.to_thread(_prepare, path, config, settings, verified)
    llm = config.llm
    context = min(
        llm.max_context_len or prepared.files.max_position_embeddings, prepared.files.max_position_embeddings
    )
    limits = EngineLimits(
        llm.max_num_seqs, llm.max_waiting, context, llm.prefill_tokens_per_step,
        llm.prefill_chunk_tokens, llm.max_itl_ms, llm.max_queue_wait_s, llm.kv_pool_bytes,
    )  # fmt: skip
    cache = PrefixCache(llm.kv_cache_bytes, llm.context_ttl_s, time.monotonic, llm.prefix_block_tokens)
    holder: list[weakref.ref[LlmVersion]] = []

    def sink(events: list[tuple[Sequence, GenerationEvent]]) -> None:
        # Weakly: the engine holds this sink and the version holds the engine; a cycle would
        # keep an unloaded startup version (frozen out of the collector) and its weights for good.
        served = holder[0]() if holder else None
        if served is not None:
            served.sink(events)

    engine = GenerationEngine(prepared.decoder, limits, cache, sink)
    await asyncio.to_thread(engine.warm_up)
    eos = prepared.files.eos_token_ids
    if not eos and prepared.tokenizer.eos_token:
        found = prepared.tokenizer.token_id(prepared.tokenizer.eos_token)
        eos = () if found is None else (found,)
    served = LlmVersion(
        llm_info(name, str(version), prepared.providers),
        engine,
        prepared.tokenizer,
        eos,
        context,
        _default_max_tokens(prepared.files, config),
        loop,
    )
    served.cache_salt_header = llm.cache_salt_header.lower() if llm.cache_salt_header else None
    holder.append(weakref.ref(served))
    engine.start(f"{name}-{version}")
    logger.info(
        "loaded llm %s version %d: %d layers, %d kv heads x %d, context %d, max_num_seqs %d, "
        "prefix cache %d bytes, %s, warmed up in %.2f s",
        name, version, prepared.decoder.layout.layers, prepared.decoder.layout.kv_heads,
        prepared.decoder.layout.head_dim, context, llm.max_num_seqs, llm.kv_cache_bytes,
        "decode and chunk in one run" if prepared.decoder.fused is not None else "separate chunks",
        time.perf_counter() - started,
    )  # fmt: skip
    return served
