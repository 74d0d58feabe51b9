"""Benchmarks of agentlease (not run by the test suite). See ``bench/README.md``."""
