"""TensorRT's options: caches keyed by GPU, TensorRT and graph; profiles from the batch sizes."""

from __future__ import annotations

from pathlib import Path

from model_builders import serialized
from ortserve.core.tensorrt import (
    InputShape,
    cache_folder,
    graph_inputs,
    model_digest,
    profile_ranges,
    tensorrt_options,
)
from ortserve.demo import build_mlp

IMAGE = InputShape("image", (None, 3, 8, 8))


def test_profiles_cover_every_batch_size_once_with_an_optimum_at_each_preferred_size() -> None:
    assert profile_ranges(64, [8, 32]) == [(1, 8), (9, 32), (33, 64)]
    assert profile_ranges(16, [32, 16, 4, 4]) == [(1, 4), (5, 16)]
    assert profile_ranges(0, [8]) == [(1, 1)]


def test_options_name_a_cache_per_gpu_tensorrt_and_graph_and_one_profile_per_range(tmp_path: Path) -> None:
    a = cache_folder(tmp_path, "NVIDIA H200", "10.9.0", model_digest([b"graph a"]))
    b = cache_folder(tmp_path, "NVIDIA H200", "10.9.0", model_digest([b"graph b"]))
    c = cache_folder(tmp_path, "NVIDIA L4", "10.9.0", model_digest([b"graph a"]))
    assert len({a, b, c}) == 3 and a.parent == b.parent and a.parent.name == "NVIDIA_H200-trt10.9.0"
    options = tensorrt_options({"trt_fp16_enable": "True"}, [IMAGE], 32, [8], a)
    assert options["trt_fp16_enable"] == "True" and options["trt_engine_cache_path"] == str(a)
    assert options["trt_engine_cache_enable"] == "True" and options["trt_timing_cache_path"] == str(a.parent)
    assert options["trt_profile_min_shapes"] == "image:1x3x8x8,image:9x3x8x8"
    assert options["trt_profile_max_shapes"] == "image:8x3x8x8,image:32x3x8x8"
    assert options["trt_profile_opt_shapes"] == options["trt_profile_max_shapes"]


def test_the_users_profiles_and_paths_win_and_symbolic_inner_dims_set_no_profile(tmp_path: Path) -> None:
    mine = {"trt_engine_cache_path": "/mine", "trt_profile_min_shapes": "image:2x3x8x8"}
    options = tensorrt_options(mine, [IMAGE], 32, [], tmp_path)
    assert options["trt_engine_cache_path"] == "/mine"
    assert options["trt_profile_min_shapes"] == "image:2x3x8x8" and "trt_profile_max_shapes" not in options
    text = InputShape("tokens", (None, None))
    assert "trt_profile_min_shapes" not in tensorrt_options({}, [text], 32, [], tmp_path)


def test_graph_inputs_are_read_from_the_bytes_without_initializers() -> None:
    graph = serialized(build_mlp([64, 16, 4], 1, "m"))
    (only,) = graph_inputs(graph)
    assert only.dims[1:] == (64,) and only.dims[0] is None
