"""The seed applications served as pipelines: search hotwords and logistics dispatch."""
