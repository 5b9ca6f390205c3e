"""Logistics dispatch: pair features, a batched multi-objective scorer, capacity-aware decoding."""
