"""The pipeline runtime: model calls batch on the schedulers, chunking, step plans, OIP serving."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import orjson
import pytest

from ortserve.core.clock import LoopClock
from ortserve.core.datatypes import bf16_from_float32
from ortserve.core.job import BatchJob
from ortserve.core.model import ModelState, ServedVersion, VersionInfo
from ortserve.core.policy import SchedulingPolicy
from ortserve.core.scheduler import Scheduler
from ortserve.core.types import InferInput, InferRequest, TensorSpec
from ortserve.demo import build_mlp
from ortserve.errors import ConfigError, InvalidInput, ModelNotFound
from ortserve.pipeline import runtime
from ortserve.pipeline.contract import JsonObject, MaybeAwaitable, ModelCall, ModelOutputs, PipelineContext
from ortserve.pipeline.runtime import PipelineRunner, import_pipeline, load_pipeline
from ortserve.testing import pipeline_harness

Array = np.ndarray


class RecordingExecutor:
    """Doubles its input; records the rows of every batch and the thread it was asked from."""

    inline_below_s = 0.0  # never inline: these tests drive runs by hand

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.batches: list[int] = []
        self._loop = loop

    @property
    def instances(self) -> int:
        return 1

    def execute(self, job: BatchJob) -> None:
        self._loop.call_soon(self._run, job)

    def _run(self, job: BatchJob | None) -> None:
        while job is not None:  # like a worker, run the batches each completion hands back
            self.batches.append(len(job.feeds["x"]))
            job = job.complete(([job.feeds["x"] * 2], 0.0001), None, chain=True)


class Resolver:
    def __init__(self, served: ServedVersion) -> None:
        self.served = served

    def resolve(self, name: str, version: str | None) -> ServedVersion:
        if name != self.served.info.name:
            raise ModelNotFound(name)
        return self.served

    def served_versions(self, name: str) -> tuple[str, ...]:
        return ("1",)

    @property
    def all_ready(self) -> bool:
        return True


def doubling_model(max_batch_size: int, datatype: str = "FP32") -> tuple[Resolver, RecordingExecutor]:
    loop = asyncio.get_running_loop()
    executor = RecordingExecutor(loop)
    info = VersionInfo(
        "double",
        "1",
        (TensorSpec("x", datatype, (-1, 2)),),
        (TensorSpec("y", datatype, (-1, 2)),),
        max_batch_size,
        ("fake",),
    )
    policy = SchedulingPolicy(max_batch_size=max_batch_size, max_queue_delay_s=0.002)
    return Resolver(ServedVersion(info, Scheduler(executor, policy, LoopClock(loop), loop))), executor


class EchoPipeline:
    """{"x": [[a, b], ...]} -> {"y": doubled rows}; records the threads its steps ran on."""

    route: str | None = "/v1/echo"

    def __init__(self, context: PipelineContext | None = None) -> None:
        self.threads: list[int] = []

    def parse(self, document: object) -> list[list[float]]:
        if not isinstance(document, dict) or not isinstance(document.get("x"), list):
            raise InvalidInput("field 'x' must be a list of pairs")
        return list(document["x"])

    def preprocess(self, rows: list[list[float]]) -> list[ModelCall]:
        self.threads.append(threading.get_ident())
        return [ModelCall("double", {"x": np.asarray(rows, dtype=np.float32).reshape(-1, 2)})]

    def postprocess(
        self, outputs: Sequence[ModelOutputs], rows: list[list[float]]
    ) -> MaybeAwaitable[JsonObject]:
        return {"y": np.asarray(outputs[0]["y"]).tolist()}

    def example(self) -> JsonObject:
        return {"x": [[1.0, 2.0]]}


class AsyncEchoPipeline(EchoPipeline):
    async def postprocess(self, outputs: Sequence[ModelOutputs], rows: list[list[float]]) -> JsonObject:
        await asyncio.sleep(0)
        return {"y": np.asarray(outputs[0]["y"]).tolist()}


class Bf16Pipeline(EchoPipeline):
    """Feeds bfloat16 bit patterns; answers with what came back, as is."""

    def preprocess(self, rows: list[list[float]]) -> list[ModelCall]:
        bits = bf16_from_float32(np.asarray(rows, dtype=np.float32).reshape(-1, 2))
        return [ModelCall("double", {"x": bits})]

    def postprocess(self, outputs: Sequence[ModelOutputs], rows: list[list[float]]) -> JsonObject:
        y = outputs[0]["y"]
        return {"dtype": str(y.dtype), "bits": y.tolist()}


async def test_rows_from_concurrent_requests_batch_together_on_the_model_scheduler() -> None:
    resolver, executor = doubling_model(max_batch_size=64)
    runner = await PipelineRunner.build(EchoPipeline(), resolver)
    executor.batches.clear()
    answers = await asyncio.gather(*(runner.run({"x": [[i, i + 1]]}) for i in range(16)))
    assert [a["y"] for a in answers] == [[[2 * i, 2 * i + 2]] for i in range(16)]
    assert sum(executor.batches) == 16
    assert len(executor.batches) < 16 and max(executor.batches) > 1


async def test_a_call_larger_than_max_batch_size_is_chunked_and_reassembled_in_order() -> None:
    resolver, executor = doubling_model(max_batch_size=4)
    runner = await PipelineRunner.build(EchoPipeline(), resolver)
    executor.batches.clear()
    rows = [[i, -i] for i in range(10)]
    answer = await runner.run({"x": rows})
    assert answer["y"] == [[2 * a, 2 * b] for a, b in rows]
    assert max(executor.batches) <= 4 and sum(executor.batches) == 10


async def test_uint16_bit_patterns_feed_a_bf16_model_input_as_bf16() -> None:
    resolver, _ = doubling_model(max_batch_size=4, datatype="BF16")
    runner = await PipelineRunner.build(Bf16Pipeline(), resolver)
    answer = await runner.run({"x": [[1.0, 0.5]]})
    assert answer == {"dtype": "uint16", "bits": [[0x3F80 * 2, 0x3F00 * 2]]}  # the fake doubles the bits


async def test_fast_sync_steps_run_inline_and_async_steps_are_awaited() -> None:
    resolver, _ = doubling_model(max_batch_size=8)
    pipeline = AsyncEchoPipeline()
    runner = await PipelineRunner.build(pipeline, resolver)
    assert [(p.name, p.mode) for p in runner.plans] == [("preprocess", "inline"), ("postprocess", "async")]
    pipeline.threads.clear()
    await runner.run({"x": [[1, 2]]})
    assert pipeline.threads == [threading.get_ident()]


async def test_a_sync_step_slower_than_the_inline_limit_moves_to_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime, "INLINE_LIMIT_S", -1.0)
    resolver, _ = doubling_model(max_batch_size=8)
    pipeline = EchoPipeline()
    runner = await PipelineRunner.build(pipeline, resolver)
    assert [p.mode for p in runner.plans] == ["thread", "thread"]
    pipeline.threads.clear()
    await runner.run({"x": [[1, 2]]})
    assert pipeline.threads and threading.get_ident() not in pipeline.threads


async def test_oip_infer_answers_each_bytes_json_document_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(runtime.BUILTIN_PIPELINES, "echo", f"{__name__}:EchoPipeline")
    resolver, _ = doubling_model(max_batch_size=8)
    served = await load_pipeline("echo", PipelineContext("double", "1", Path(".")), resolver)
    assert served.info.name == "double.pipeline" and served.route == "/v1/echo"
    documents = np.array([b'{"x": [[1, 2]]}', b'{"x": [[3, 4], [5, 6]]}'], dtype=object)
    response = await served.infer(
        InferRequest("double.pipeline", [InferInput("request", "BYTES", (2,), documents)])
    )
    [output] = response.outputs
    assert output.name == "response"
    assert [orjson.loads(item) for item in output.data] == [{"y": [[2, 4]]}, {"y": [[6, 8], [10, 12]]}]
    with pytest.raises(InvalidInput, match="'request'"):
        served.submit(InferRequest("double.pipeline", [InferInput("other", "BYTES", (1,), documents[:1])]))
    with pytest.raises(InvalidInput, match="not valid JSON"):
        await served.handle_body(b"{not json")
    with pytest.raises(InvalidInput, match="field 'x'"):
        await served.handle_body(b'{"y": 1}')


@pytest.mark.parametrize(
    "spec", ["no_colon_here", "ortserve.no_such_module:Thing", "ortserve.errors:NoSuchClass"]
)
def test_a_pipeline_spec_that_names_nothing_importable_is_a_config_error(spec: str) -> None:
    with pytest.raises(ConfigError, match="field pipeline"):
        import_pipeline(spec)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("os:system", "'os' is the standard library"),
        ("subprocess:Popen", "'subprocess' is the standard library"),
        ("ortserve.demo:write_demo_repository", "is not a class"),
        ("ortserve.errors:InvalidInput", "does not implement the pipeline contract \\(missing parse"),
    ],
)
def test_a_pipeline_spec_must_name_a_class_implementing_the_contract(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        import_pipeline(spec)


def test_pipelines_registered_as_entry_points_load_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    import ortserve.pipeline.spec as spec_module

    point = EntryPoint("hotwords2", "ortserve.apps.hotword.pipeline:HotwordPipeline", "ortserve.pipelines")

    def registered(group: str, name: str) -> list[EntryPoint]:
        return [point] if (group, name) == (point.group, point.name) else []

    monkeypatch.setattr(spec_module, "entry_points", registered)
    assert import_pipeline("hotwords2").__name__ == "HotwordPipeline"
    with pytest.raises(ConfigError, match="entry point of group 'ortserve.pipelines'"):
        import_pipeline("unregistered")


async def test_a_pipeline_that_fails_to_load_fails_alone_and_its_model_still_serves(tmp_path: Path) -> None:
    (tmp_path / "mlp" / "1").mkdir(parents=True)
    onnx.save(build_mlp([4, 8, 2], 0, "mlp"), str(tmp_path / "mlp" / "1" / "model.onnx"))
    (tmp_path / "mlp" / "config.yaml").write_text(
        "pipeline: ortserve.no_such_module:Thing\n", encoding="utf-8"
    )
    async with pipeline_harness(tmp_path) as harness:
        pipeline_entry = harness.registry.entry("mlp.pipeline")
        assert pipeline_entry.state is ModelState.FAILED and "no_such_module" in (pipeline_entry.error or "")
        assert harness.registry.entry("mlp").state is ModelState.READY


def test_the_pipeline_package_exports_exactly_the_contract() -> None:
    import ortserve.pipeline as package
    from ortserve.pipeline import contract

    assert sorted(package.__all__) == sorted(contract.__all__)
    assert all(getattr(package, name) is getattr(contract, name) for name in package.__all__)
