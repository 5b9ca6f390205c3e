"""Regenerate the message modules from the .proto files in src/ortserve/protocol/grpc/.

Usage: ``python scripts/gen_proto.py`` (rewrite them) or ``--check`` (exit 1 if they are stale).

The generated message modules register their files in a private descriptor pool instead of
protobuf's default one: the package must be ``inference`` for wire compatibility, and
tritonclient's own stubs define the same symbols, so both in one process (tests, tools) would
otherwise collide with "duplicate symbol". model_config_pb2 creates the pool; grpc_service_pb2
(which imports model_config.proto) adds its file to that same pool.

No grpcio service stubs are generated: the server is ortserve's own HTTP/2 front (it routes
by method path to handlers), and clients bring their own stubs (tritonclient).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOT = ROOT / "src"
PACKAGE = Path("ortserve/protocol/grpc")
PROTOS = ("model_config.proto", "grpc_service.proto", "apps.proto")
OUTPUTS = (
    "model_config_pb2.py",
    "model_config_pb2.pyi",
    "grpc_service_pb2.py",
    "grpc_service_pb2.pyi",
    "apps_pb2.py",
    "apps_pb2.pyi",
)
_DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_PRIVATE_POOL = (
    "# A private pool: tritonclient defines the same 'inference' symbols in the default one.\n"
    "POOL = _descriptor_pool.DescriptorPool()\n"
    "DESCRIPTOR = POOL.AddSerializedFile("
)
_SHARED_POOL = (
    "# model_config_pb2's private pool, which already holds the file this one imports.\n"
    "POOL = ortserve_dot_protocol_dot_grpc_dot_model__config__pb2.POOL\n"
    "DESCRIPTOR = POOL.AddSerializedFile("
)
_APPS_POOL = (
    "# A private pool of its own: the seed applications' typed services (ortserve.apps.v1).\n"
    "POOL = _descriptor_pool.DescriptorPool()\n"
    "DESCRIPTOR = POOL.AddSerializedFile("
)
_POOLS = {
    "model_config_pb2.py": _PRIVATE_POOL,
    "grpc_service_pb2.py": _SHARED_POOL,
    "apps_pb2.py": _APPS_POOL,
}


def generate(out_dir: Path) -> dict[str, str]:
    """Run protoc into ``out_dir``; returns each output file's final text."""
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{SOURCE_ROOT}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            *(str(PACKAGE / proto) for proto in PROTOS),
        ]
    )
    if status != 0:
        raise SystemExit(f"protoc failed with status {status}")
    texts = {name: (out_dir / PACKAGE / name).read_text() for name in OUTPUTS}
    for name, pool in _POOLS.items():
        if _DEFAULT_POOL not in texts[name]:
            raise SystemExit(f"generated {name} no longer has the expected pool line")
        texts[name] = texts[name].replace(_DEFAULT_POOL, pool)
    return texts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed files are stale")
    args = parser.parse_args()
    target = SOURCE_ROOT / PACKAGE
    with tempfile.TemporaryDirectory() as tmp:
        texts = generate(Path(tmp))
    stale = [name for name, text in texts.items() if _read(target / name) != text]
    if args.check:
        for name in stale:
            print(f"stale: {target / name}", file=sys.stderr)
        return 1 if stale else 0
    for name in stale:
        (target / name).write_text(texts[name])
        print(f"wrote {target / name}")
    return 0


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


if __name__ == "__main__":
    sys.exit(main())
