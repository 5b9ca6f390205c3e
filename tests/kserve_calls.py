"""KServe's own Python client against a running server, in a process of its own.

Run as ``python kserve_calls.py HTTP_URL GRPC_ADDRESS``; prints one JSON object. A separate
process because kserve's generated ``grpc_predict_v2`` messages declare the same protobuf
package (``inference``) as tritonclient's and ortserve's, and one process's descriptor pool
refuses the duplicate symbols.
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

DATA = np.random.default_rng(11).standard_normal((3, 64)).astype(np.float32)
"""The rows every infer call sends to small_mlp."""


def _request(request_id: str, binary: bool = False) -> InferRequest:
    tensor = InferInput("input", list(DATA.shape), "FP32")
    tensor.set_data_from_numpy(DATA, binary_data=binary)
    return InferRequest(model_name="small_mlp", infer_inputs=[tensor], request_id=request_id)


async def _rest(url: str) -> dict[str, object]:
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    try:
        found: dict[str, object] = {
            "live": await client.is_server_live(url),
            "ready": await client.is_server_ready(url),
            "model_ready": await client.is_model_ready(url, "small_mlp"),
        }
        for binary in (False, True):
            answer = await client.infer(url, _request(f"rest-{binary}", binary), "small_mlp")
            found[f"infer_binary_{binary}"] = [answer.id, answer.outputs[0].as_numpy().tolist()]
        return found
    finally:
        await client.close()


async def _grpc(address: str) -> dict[str, object]:
    client = InferenceGRPCClient(address)
    try:
        answer = await client.infer(_request("grpc"))
        return {
            "live": await client.is_server_live(),
            "ready": await client.is_server_ready(),
            "model_ready": await client.is_model_ready("small_mlp"),
            "infer": [answer.id, answer.outputs[0].as_numpy().tolist()],
        }
    finally:
        await client.close()


async def _main(url: str, address: str) -> None:
    print(json.dumps({"rest": await _rest(url), "grpc": await _grpc(address)}))


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2]))
