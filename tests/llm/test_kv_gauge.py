"""The keys-and-values gauge: within its budget, and down when the prefix cache's time to live
drops what it held, without waiting for another request."""

from __future__ import annotations

from pathlib import Path

from ortserve.config.model import ModelConfig
from ortserve.llm.demo import DEMO_LLM_NAME, write_demo_llm
from ortserve.llm.loader import load_llm_version
from ortserve.llm.servable import sampling_from
from ortserve.settings import ServerSettings
from waiting import until


async def test_the_kv_gauge_stays_within_budget_and_falls_when_the_ttl_evicts(tmp_path: Path) -> None:
    write_demo_llm(tmp_path)
    model = tmp_path / DEMO_LLM_NAME / "1" / "model.onnx"
    config = ModelConfig.model_validate(
        {"kind": "llm", "intra_op_threads": 1, "llm": {"context_ttl_s": 0.3, "prefix_block_tokens": 4}}
    )
    served = await load_llm_version("tiny", 1, model, config, ServerSettings(model_repository=tmp_path))
    try:
        prompt = served.tokenizer.encode("The lighthouse stood at the end of the long stone pier")
        stream = served.generate(prompt, sampling_from({"max_tokens": 8, "temperature": 0}, 8))
        await stream.collect()
        assert served.engine.cache.bytes_used > 0
        assert 0 < served.kv_bytes <= served.kv_budget_bytes
        # The engine thread wakes for the expiry on its own, 0.3 s on: no request prompts it.
        await until(lambda: served.kv_bytes == 0, 10, "the gauge at zero after the TTL")
    finally:
        await served.unload(1.0)
