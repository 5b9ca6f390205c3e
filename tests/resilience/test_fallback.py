"""The fallback chain on real ONNX Runtime sessions: every level entered and left, no batch
failed twice, input faults never blamed on a level, probes on a fake clock."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import pytest

from model_builders import scaled_model, serialized
from ortserve.config.model import ModelConfig
from ortserve.config.resilience import DefaultAnswerConfig, FaultConfig, StaticOutput
from ortserve.core.marks import MarkedArray, unmark
from ortserve.core.session import SessionPlan
from ortserve.core.types import TensorSpec
from ortserve.errors import ConfigError, InvalidInput
from ortserve.repository.config_source import read_model_source
from ortserve.resilience.breaker import Breaker, BreakerPolicy
from ortserve.resilience.building import VersionParts, build_guard
from ortserve.resilience.chain import FallbackChain, NoUsableLevel
from ortserve.resilience.defaults import DefaultAnswers
from ortserve.resilience.faults import FaultInjector
from ortserve.resilience.guard import ResilienceGuard
from ortserve.resilience.levels import DefaultLevel, Level, SessionLevel
from ortserve.settings import ServerSettings
from ortserve.testing import FakeClock
from waiting import until

SPEC_IN = (TensorSpec("x", "FP32", (-1, 4)),)
SPEC_OUT = (TensorSpec("y", "FP32", (-1, 4)),)
WARMUP: dict[str, npt.NDArray[np.generic]] = {"x": np.ones((1, 4), dtype=np.float32)}
BROKEN = FaultConfig(error_rate=1.0)


def session(scale: float) -> ort.InferenceSession:
    return ort.InferenceSession(serialized(scaled_model(scale)), providers=["CPUExecutionProvider"])


def rows(n: int) -> dict[str, np.ndarray]:
    return {"x": np.arange(n * 4, dtype=np.float32).reshape(n, 4)}


class Built:
    """A chain of L0 (x2), L1 (x2, another session), L2 (x3, built at first need), L3 (static -1)."""

    def __init__(self, clock: FakeClock, last_good: int = 0, static: bool = True) -> None:
        self.built_l2 = 0
        primary = session(2.0)
        default = DefaultAnswerConfig(
            outputs={"y": StaticOutput(data=[-1, -1, -1, -1])} if static else None, last_good=last_good
        )
        self.answers = DefaultAnswers(default, SPEC_IN, SPEC_OUT, True, "test")
        self.levels: list[Level] = [
            SessionLevel(0, "L0 primary", lambda: primary, ["y"], WARMUP, session=primary),
            SessionLevel(1, "L1 device 1", lambda: session(2.0), ["y"], WARMUP),
            SessionLevel(2, "L2 model light", self._build_l2, ["y"], WARMUP, chunk_rows=2),
            DefaultLevel(self.answers),
        ]
        policy = BreakerPolicy(consecutive_failures=2, open_s=1.0, min_runs=1000)
        self.breakers = [Breaker(policy, clock.now) for _ in self.levels]
        self.chain = FallbackChain("model 'm' version 1", primary, self.levels, self.breakers, self.answers)
        self.chain.armed = True

    def _build_l2(self) -> ort.InferenceSession:
        self.built_l2 += 1
        return session(3.0)

    def run(self, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, int]:
        outputs, degraded = unmark(self.chain.run(["y"], batch))
        return outputs[0], 0 if degraded is None else degraded.level

    def break_level(self, index: int) -> None:
        level = self.levels[index]
        assert isinstance(level, SessionLevel | DefaultLevel)
        level.faults = FaultInjector(BROKEN)

    def heal(self, index: int) -> None:
        level = self.levels[index]
        assert isinstance(level, SessionLevel | DefaultLevel)
        level.faults = None


def test_every_level_is_entered_and_left_and_no_batch_fails() -> None:
    clock = FakeClock()
    built = Built(clock)
    x = rows(5)
    answer, level = built.run(x)
    assert level == 0
    np.testing.assert_array_equal(answer, x["x"] * 2)
    assert built.built_l2 == 0  # the fallback session is built at first need
    expected = {0: x["x"] * 2, 1: x["x"] * 2, 2: x["x"] * 3, 3: np.full((5, 4), -1.0)}
    for broken in (0, 1, 2):
        built.break_level(broken)
        for _ in range(3):  # every batch is answered, by the next level
            answer, level = built.run(x)
            assert level == broken + 1
            np.testing.assert_array_equal(answer, expected[level])
        assert built.chain.current_level() == broken + 1
    assert built.built_l2 == 1
    for healed in (2, 1, 0):
        built.heal(healed)
        due = built.breakers[healed].probe_at()
        assert due is not None
        clock.advance(due - clock.now())
        built.chain.probe()  # the half-open probe (warm-up inputs) closes the healed level
        answer, level = built.run(x)
        assert level == healed
        np.testing.assert_array_equal(answer, expected[healed])
    assert built.chain.transitions == {(0, 1): 1, (1, 2): 1, (2, 3): 1, (3, 2): 1, (2, 1): 1, (1, 0): 1}


def test_a_failing_level_fails_no_request_while_its_breaker_is_still_closed() -> None:
    built = Built(FakeClock())
    built.break_level(0)
    answer, level = built.run(rows(2))  # failed on L0, answered by L1 in the same run
    np.testing.assert_array_equal(answer, rows(2)["x"] * 2)
    assert level == 1 and built.breakers[0].allows
    assert built.chain.failures == {(0, "persistent"): 1}


def test_a_failed_probe_keeps_the_level_open() -> None:
    clock = FakeClock()
    built = Built(clock)
    built.break_level(0)
    built.run(rows(1))
    built.run(rows(1))
    assert not built.breakers[0].allows
    clock.advance(1.0)
    built.chain.probe()
    assert built.chain.current_level() == 1
    assert "probe failed" in built.breakers[0].reason


def test_an_input_fault_is_a_400_and_no_level_is_blamed() -> None:
    built = Built(FakeClock())
    with pytest.raises(InvalidInput, match="could not run this input"):
        built.chain.run(["y"], {"x": np.ones((2, 3), dtype=np.float32)})  # ONNX Runtime's InvalidArgument
    assert built.chain.failures == {} and built.chain.current_level() == 0


def test_with_every_level_open_the_chain_refuses_with_each_reason() -> None:
    built = Built(FakeClock(), static=False)
    for index in (0, 1, 2):
        built.break_level(index)
    with pytest.raises(NoUsableLevel) as caught:
        built.chain.run(["y"], rows(1))
    message = caught.value.message
    assert "L0 primary: injected persistent fault" in message
    assert "L3 default answer: no earlier answer for this input" in message


def test_the_last_good_answer_is_returned_for_an_identical_input_only() -> None:
    built = Built(FakeClock(), last_good=2, static=False)
    seen = rows(2)
    built.run(seen)
    for index in (0, 1, 2):
        built.break_level(index)
    answer, level = built.run({"x": seen["x"][1:2]})
    assert level == 3
    np.testing.assert_array_equal(answer, seen["x"][1:2] * 2)
    with pytest.raises(NoUsableLevel):
        built.run({"x": seen["x"][1:2] + 1})


def test_remembered_rows_are_bounded() -> None:
    answers = DefaultAnswers(DefaultAnswerConfig(last_good=3), SPEC_IN, SPEC_OUT, True, "test")
    batch = rows(5)
    answers.remember(batch, [batch["x"] * 2])
    with pytest.raises(LookupError):
        answers.answer({"x": batch["x"][0:1]})  # evicted, least recently used
    np.testing.assert_array_equal(answers.answer({"x": batch["x"][4:5]}), [batch["x"][4:5] * 2])


def test_the_mark_survives_the_schedulers_slicing_and_is_stripped() -> None:
    built = Built(FakeClock())
    built.break_level(0)
    outputs = built.chain.run(["y"], rows(4))
    piece = [out[1:3] for out in outputs]  # what the scheduler hands one request
    assert type(piece[0]) is MarkedArray
    plain, degraded = unmark(piece)
    assert degraded is not None and degraded.level == 1
    assert type(plain[0]) is np.ndarray


async def test_the_guard_probes_on_its_clock_without_traffic_and_readiness_follows() -> None:
    clock = FakeClock()
    built = Built(clock)
    guard = ResilienceGuard(built.chain, None, ready_when_degraded=False)
    guard.start(asyncio.get_running_loop(), clock)
    built.break_level(0)
    built.run(rows(1))
    built.run(rows(1))
    await asyncio.sleep(0)  # the breaker's opening is handed to the loop
    assert not guard.ready
    assert guard.parameters()["fallback_level"] == 1
    built.heal(0)
    clock.advance(1.0)  # the probe timer fires; the probe runs in a thread
    await until(lambda: guard.ready, 5, "readiness after the probe")
    assert guard.parameters() == {"fallback_level": 0}
    await guard.close()


def test_config_pbtxt_parameters_carry_the_resilience_sections(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.pbtxt").write_text(
        'backend: "onnxruntime"\n'
        'parameters { key: "ortserve.fallback" value: { string_value: "{session: cpu, degraded_status: 206}" } }\n'
        'parameters { key: "ortserve.faults" value: { string_value: "{L0: {error_after: 3}}" } }\n'
        'parameters { key: "ortserve.inputs" value: { string_value: "{x: {max: 1}}" } }\n'
        'parameters { key: "ortserve.providers_strict" value: { string_value: "false" } }\n'
    )
    config = read_model_source(folder).config
    assert config.fallback is not None and config.fallback.degraded_status == 206
    assert config.faults["L0"].error_after == 3
    assert config.inputs["x"].max == 1
    (folder / "config.pbtxt").write_text(
        'parameters { key: "ortserve.fallback" value: { string_value: "{sesion: cpu}" } }\n'
    )
    with pytest.raises(ConfigError, match="fallback.sesion"):
        read_model_source(folder)


def test_a_bfloat16_graph_refuses_a_fallback_chain(tmp_path: Path) -> None:
    plan = SessionPlan((("CPUExecutionProvider", {}),), (), 1, 1, None, "all")
    spec = (TensorSpec("x", "BF16", (-1, 4)),)
    parts = VersionParts(
        "model 'b' version 1", tmp_path / "model.onnx", plan, session(2.0), spec, spec, 8, {}
    )
    with pytest.raises(ConfigError, match="not supported for bfloat16 graphs"):
        build_guard(parts, ModelConfig.model_validate({"fallback": {}}), ServerSettings(tmp_path))


async def test_a_closed_guard_and_its_chain_go_with_their_last_reference_not_a_collection() -> None:
    """Startup versions are frozen out of the collector (``gc.freeze``), so an unloaded version
    must be freed by reference counting alone: no cycle through the guard, the chain or a level."""
    primary = session(2.0)
    level = SessionLevel(0, "L0 primary", lambda: session(2.0), ["y"], WARMUP, session=primary)
    chunked = SessionLevel(2, "L2 model light", lambda: session(3.0), ["y"], WARMUP, chunk_rows=2)
    clock = FakeClock()
    breakers = [Breaker(BreakerPolicy(), clock.now) for _ in range(2)]
    chain = FallbackChain("m", primary, [level, chunked], breakers)
    guard = ResilienceGuard(chain, None)
    guard.start(asyncio.get_running_loop(), clock)
    assert level.direct is not None  # the common path: one call into the session
    assert chunked.direct is None  # its run chunks the batch
    outputs, _ = unmark(chain.run(["y"], rows(2)))
    np.testing.assert_array_equal(outputs[0], rows(2)["x"] * 2)
    level.faults = FaultInjector(BROKEN)
    outputs, degraded = unmark(chain.run(["y"], rows(3)))  # answered by the chunked level
    assert degraded is not None and degraded.level == 2
    np.testing.assert_array_equal(outputs[0], rows(3)["x"] * 3)
    await guard.close()
    gone = [weakref.ref(o) for o in (guard, chain, level, chunked, primary)]
    del guard, chain, level, chunked, primary, breakers
    gc.disable()
    try:
        await asyncio.sleep(0)  # what the loop still held of the guard (its probe timer) is released
        assert [ref() is None for ref in gone] == [True] * 5
    finally:
        gc.enable()
