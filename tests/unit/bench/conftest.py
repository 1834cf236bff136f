"""ddtree-bench test fixtures (defined in bench_testlib: every test dir has its own conftest)."""
from bench_testlib import standin  # noqa: F401
