"""The shared-memory registry on real /dev/shm objects: bounds, keys, limits, lifetime, delivery."""

from __future__ import annotations

import asyncio
import gc
import os
import uuid
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest

from ortserve.core.shared_memory import (
    BYTE_SIZE,
    OFFSET,
    REGION,
    RegionStatus,
    SharedMemoryRegistry,
    deliver_to_shared_memory,
)
from ortserve.core.types import InferOutput, InferResponse, Parameters, RequestedOutput
from ortserve.errors import InvalidInput, NotImplementedByServer
from shared_memory_helpers import buffer_of, key_of

SHM = Path("/dev/shm")


def test_register_status_unregister(block: shared_memory.SharedMemory) -> None:
    registry = SharedMemoryRegistry(4)
    registry.register("a", key_of(block), 8192, 1024)
    assert registry.status() == [RegionStatus("a", key_of(block), 8192, 1024)]
    assert registry.status("a") == [RegionStatus("a", key_of(block), 8192, 1024)]
    registry.unregister("a")
    assert registry.status() == []
    registry.unregister("a")  # unknown names are no error, as in Triton


def test_a_view_reads_and_writes_the_clients_bytes_at_offsets(block: shared_memory.SharedMemory) -> None:
    registry = SharedMemoryRegistry(4)
    buffer_of(block)[5000:5016] = np.arange(4, dtype=np.float32).tobytes()
    registry.register("a", key_of(block), 4999, 100)  # an offset that is no page multiple
    view = registry.view({REGION: "a", BYTE_SIZE: 16, OFFSET: 1}, "input 'x'")
    assert view is not None
    assert np.frombuffer(view, np.float32).tolist() == [0.0, 1.0, 2.0, 3.0]
    view[:4] = np.float32(9).tobytes()
    assert np.frombuffer(buffer_of(block)[5000:5004], np.float32)[0] == 9.0


def test_parameters_without_a_region_name_none() -> None:
    assert SharedMemoryRegistry(4).view({"binary_data_size": 4}, "input 'x'") is None


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({REGION: "a", BYTE_SIZE: 101}, "exceeds the 100 bytes of region 'a'"),
        ({REGION: "a", BYTE_SIZE: 60, OFFSET: 50}, "offset 50 \\+ byte size 60 exceeds"),
        ({REGION: "nope", BYTE_SIZE: 4}, "region 'nope' is not registered"),
        ({REGION: "a"}, "'shared_memory_byte_size' must be a non-negative integer"),
        ({BYTE_SIZE: 4}, "'shared_memory_region' must be a region name"),
        ({REGION: "a", BYTE_SIZE: -1}, "must be a non-negative integer"),
        ({REGION: "a", BYTE_SIZE: 4, OFFSET: 1.5}, "'shared_memory_offset' must be a non-negative integer"),
        ({REGION: "a", BYTE_SIZE: True}, "must be a non-negative integer"),
    ],
)
def test_references_are_checked_against_the_registered_window(
    block: shared_memory.SharedMemory, parameters: dict[str, object], message: str
) -> None:
    registry = SharedMemoryRegistry(4)
    registry.register("a", key_of(block), 0, 100)
    with pytest.raises(InvalidInput, match=message):
        registry.view(parameters, "input 'x'")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "offset", "size", "message"),
    [
        ("/../../etc/passwd", 0, 4, "not a valid POSIX shared-memory name"),
        ("/", 0, 4, "not a valid POSIX shared-memory name"),
        ("a/b", 0, 4, "not a valid POSIX shared-memory name"),
        ("..", 0, 4, "not a valid POSIX shared-memory name"),
        (7, 0, 4, "'key' must be a string"),
        ("/ortserve-no-such-object", 0, 4, "no shared-memory object"),
    ],
)
def test_bad_keys_are_refused(key: object, offset: int, size: int, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        SharedMemoryRegistry(4).register("a", key, offset, size)


@pytest.mark.parametrize(
    ("offset", "size", "message"),
    [
        (0, 65537, "holds 65536 bytes"),
        (65530, 8, "holds 65536 bytes"),
        (0, 0, "'byte_size' must be positive"),
        (-1, 4, "'offset' must be a non-negative integer"),
        (0, "4", "'byte_size' must be a non-negative integer"),
    ],
)
def test_windows_past_the_object_are_refused(
    block: shared_memory.SharedMemory, offset: object, size: object, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        SharedMemoryRegistry(4).register("a", key_of(block), offset, size)


def test_symlinks_and_other_files_are_refused(block: shared_memory.SharedMemory, tmp_path: Path) -> None:
    link = SHM / f"ortserve-test-link-{uuid.uuid4().hex}"
    link.symlink_to(SHM / block.name.lstrip("/"))
    try:
        with pytest.raises(InvalidInput, match="cannot open"):
            SharedMemoryRegistry(4).register("a", "/" + link.name, 0, 4)
    finally:
        link.unlink()
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InvalidInput, match="not a regular memory object"):
        SharedMemoryRegistry(4, directory=tmp_path).register("a", "fifo", 0, 4)


def test_duplicate_names_and_the_region_limit(block: shared_memory.SharedMemory) -> None:
    registry = SharedMemoryRegistry(2)
    registry.register("a", key_of(block), 0, 4)
    with pytest.raises(InvalidInput, match="'a' is already registered"):
        registry.register("a", key_of(block), 0, 4)
    registry.register("b", key_of(block), 0, 4)
    with pytest.raises(InvalidInput, match="2 shared-memory regions are registered"):
        registry.register("c", key_of(block), 0, 4)
    registry.unregister()
    registry.register("c", key_of(block), 0, 4)


def test_the_extension_is_off_without_a_region_allowance(block: shared_memory.SharedMemory) -> None:
    registry = SharedMemoryRegistry(0)
    for call in (
        lambda: registry.register("a", key_of(block), 0, 4),
        registry.status,
        registry.unregister,
        lambda: registry.view({REGION: "a", BYTE_SIZE: 4}, "input 'x'"),
    ):
        with pytest.raises(NotImplementedByServer, match="--shared-memory-regions"):
            call()


def test_a_shrunk_object_is_refused_instead_of_faulting(block: shared_memory.SharedMemory) -> None:
    registry = SharedMemoryRegistry(4)
    registry.register("a", key_of(block), 0, 8192)
    os.truncate(SHM / block.name.lstrip("/"), 4096)
    with pytest.raises(InvalidInput, match="has shrunk"):
        registry.view({REGION: "a", BYTE_SIZE: 8192}, "input 'x'")
    assert registry.view({REGION: "a", BYTE_SIZE: 4096}, "input 'x'") is not None


def test_unregistering_a_region_in_use_keeps_its_mapping_until_the_view_goes(
    block: shared_memory.SharedMemory,
) -> None:
    registry = SharedMemoryRegistry(4)
    buffer_of(block)[:8] = b"12345678"
    registry.register("a", key_of(block), 0, 8)
    view = registry.view({REGION: "a", BYTE_SIZE: 8}, "input 'x'")
    assert view is not None
    array = np.frombuffer(view, np.uint8)
    del view
    registry.unregister("a")
    with pytest.raises(InvalidInput, match="not registered"):
        registry.view({REGION: "a", BYTE_SIZE: 8}, "input 'x'")
    assert bytes(array) == b"12345678"  # still mapped: reading it does not fault
    maps_before = _mappings_of(block)
    del array
    gc.collect()
    assert _mappings_of(block) == maps_before - 1


def _mappings_of(block: shared_memory.SharedMemory) -> int:
    name = block.name.lstrip("/")
    return sum(1 for line in Path("/proc/self/maps").read_text().splitlines() if line.endswith(name))


def _response(data: np.ndarray, parameters: Parameters) -> InferResponse:
    output = InferOutput("y", "FP32", data.shape, data, parameters)
    return InferResponse("m", "1", [output])


async def test_outputs_are_written_into_their_window_and_answered_without_data(
    block: shared_memory.SharedMemory,
) -> None:
    registry = SharedMemoryRegistry(4)
    registry.register("out", key_of(block), 100, 64)
    parameters: Parameters = {REGION: "out", BYTE_SIZE: 32, OFFSET: 8, "binary_data": True}
    targets = registry.output_targets([RequestedOutput("y", parameters), RequestedOutput("z")])
    assert targets is not None and list(targets) == ["y"]
    pending: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
    answer = deliver_to_shared_memory(pending, targets)
    pending.set_result(_response(np.arange(6, dtype=np.float32), parameters))
    response = await answer
    assert response.outputs[0].parameters == {REGION: "out", OFFSET: 8, BYTE_SIZE: 24}
    assert np.frombuffer(buffer_of(block)[108:132], np.float32).tolist() == [0, 1, 2, 3, 4, 5]


def _delivery(
    block: shared_memory.SharedMemory,
) -> tuple[asyncio.Future[InferResponse], asyncio.Future[InferResponse]]:
    """(pending, answer) for output 'y' into an 8-byte window."""
    registry = SharedMemoryRegistry(4)
    registry.register("out", key_of(block), 0, 64)
    targets = registry.output_targets([RequestedOutput("y", {REGION: "out", BYTE_SIZE: 8})])
    assert targets is not None
    pending: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
    return pending, deliver_to_shared_memory(pending, targets)


async def test_an_output_larger_than_its_window_fails_the_request(block: shared_memory.SharedMemory) -> None:
    pending, answer = _delivery(block)
    pending.set_result(_response(np.arange(6, dtype=np.float32), {REGION: "out", BYTE_SIZE: 8}))
    with pytest.raises(InvalidInput, match="output 'y' needs 24 bytes, its shared-memory window holds 8"):
        await answer


async def test_cancelling_the_delivery_cancels_the_request(block: shared_memory.SharedMemory) -> None:
    pending, answer = _delivery(block)
    answer.cancel()
    await asyncio.sleep(0)  # done callbacks run on the next turn of the loop
    assert pending.cancelled()


def test_error_messages_quote_at_most_80_characters_of_what_the_client_sent() -> None:
    with pytest.raises(InvalidInput) as refused:
        SharedMemoryRegistry(4).view({REGION: "r" * 100_000, BYTE_SIZE: 4}, "input 'x'")
    assert len(refused.value.message) < 200
    with pytest.raises(InvalidInput) as refused:
        SharedMemoryRegistry(4).register("a", "/" + "k/" * 50_000, 0, 4)
    assert len(refused.value.message) < 200
