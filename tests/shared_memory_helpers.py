"""tritonclient's system shared-memory workflow, the same over HTTP and gRPC, for the case table."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import serialize_byte_tensor, triton_to_np_dtype


def buffer_of(block: shared_memory.SharedMemory) -> memoryview:
    """The object's mapped bytes (typed Optional by typeshed; set while the block is open)."""
    assert block.buf is not None
    return block.buf


def key_of(block: shared_memory.SharedMemory) -> str:
    """The key a client registers the object under."""
    return "/" + block.name.lstrip("/")


def _wire_form(datatype: str, array: np.ndarray) -> np.ndarray:
    """What goes into the region: BYTES as one serialized element, the rest as is."""
    return serialize_byte_tensor(array) if datatype == "BYTES" else array


def _nbytes(datatype: str, array: np.ndarray) -> int:
    wire = _wire_form(datatype, array)
    return len(wire.item()) if datatype == "BYTES" else int(wire.nbytes)


@contextlib.contextmanager
def region(client: Any, name: str, size: int, offset: int = 0) -> Iterator[Any]:
    """A fresh /dev/shm object of ``offset + size`` bytes registered as ``name``; removed after."""
    key = f"/ortserve-case-{uuid.uuid4().hex}"
    handle = shm.create_shared_memory_region(name, key, offset + size)
    try:
        client.register_system_shared_memory(name, key, size, offset=offset)
        try:
            yield handle
        finally:
            client.unregister_system_shared_memory(name)
    finally:
        shm.destroy_shared_memory_region(handle)


def infer(
    transport: Any,
    model: str,
    tensors: dict[str, tuple[str, np.ndarray]],
    outputs: dict[str, int],
    wire_outputs: tuple[str, ...] = (),
    region_offset: int = 4096 + 12,
) -> dict[str, list[Any]]:
    """Inputs and the ``outputs`` (name -> window size) through one region, answers read back.

    The region starts ``region_offset`` bytes into its object (not page-aligned on purpose);
    ``wire_outputs`` are requested on the wire beside the shared-memory ones.
    """
    name = f"case-{transport.name}"
    sizes = [_nbytes(datatype, array) for datatype, array in tensors.values()]
    total = sum(sizes) + sum(outputs.values())
    with region(transport.client, name, total, region_offset) as handle:
        inputs, position = [], 0
        for (input_name, (datatype, array)), size in zip(tensors.items(), sizes):
            shm.set_shared_memory_region(handle, [_wire_form(datatype, array)], region_offset + position)
            tensor = transport.module.InferInput(input_name, list(array.shape), datatype)
            tensor.set_shared_memory(name, size, offset=position)
            inputs.append(tensor)
            position += size
        requested, windows = [], {}
        for output_name, size in outputs.items():
            wanted = transport.module.InferRequestedOutput(output_name)
            wanted.set_shared_memory(name, size, offset=position)
            requested.append(wanted)
            windows[output_name] = position
            position += size
        requested += [transport.module.InferRequestedOutput(n) for n in wire_outputs]
        result = transport.client.infer(model, inputs, outputs=requested)
        answers = {}
        for output_name, window in windows.items():
            datatype, shape = _output_meta(transport, result, output_name)
            dtype = np.object_ if datatype == "BYTES" else triton_to_np_dtype(datatype)
            answers[output_name] = shm.get_contents_as_numpy(
                handle, dtype, shape, region_offset + window
            ).tolist()
        for output_name in wire_outputs:
            answers[output_name] = result.as_numpy(output_name).tolist()
        return answers


def _output_meta(transport: Any, result: Any, name: str) -> tuple[str, list[int]]:
    """Datatype and shape of an answered output; it must carry no data of its own."""
    output = result.get_output(name)
    if transport.name == "http":
        assert "data" not in output and "binary_data_size" not in output.get("parameters", {})
        return output["datatype"], list(output["shape"])
    assert not result.get_response().raw_output_contents or not output.HasField("contents")
    return output.datatype, list(output.shape)


def status(transport: Any, name: str = "") -> list[tuple[str, int, int]]:
    """(name, offset, byte_size) of registered regions, sorted."""
    if transport.name == "http":
        found = transport.client.get_system_shared_memory_status(name)
        return sorted((r["name"], int(r["offset"]), int(r["byte_size"])) for r in found)
    found = transport.client.get_system_shared_memory_status(name)
    return sorted((r.name, r.offset, r.byte_size) for r in found.regions.values())
