"""Traffic management between resolve and submit: per-model routing policy (override, split,
sticky buckets), gray-release rollouts with guards, shadow traffic with output comparison,
version roles and automatic retirement. See docs/traffic.md.

The modules import no transport: ``policy``, ``buckets``, ``rollout``, ``roles`` and
``retirement`` are pure; ``router`` and ``table`` apply them to requests on the event loop.
"""

__all__: list[str] = []
