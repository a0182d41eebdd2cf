"""Benchmark scripts (`python benchmarks/<name>.py ...`); importable as `benchmarks.<name>` from
the repository root, which is how the tests reach them."""
