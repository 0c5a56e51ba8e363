"""Benchmark harness for Warren: `benches/run.py` is the entry point (see docs/performance.md)."""
