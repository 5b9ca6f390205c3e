"""Per-model configuration schemas (``config.yaml``): the model's own section and those of its
features (routing, resilience, llm, warm-up).

A layer of its own, below ``core`` and every feature package: it imports only ``errors`` and
its libraries (pydantic, yaml), so the lifecycle manager, the features and the core all read
one schema without importing one another (tests/test_import_direction.py keeps it so).
"""
