"""Execution-provider faults: classification, breakers, fallback levels, fault injection, GPU health."""
