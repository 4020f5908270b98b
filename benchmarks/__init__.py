"""Speed benchmarks of the package's layers: scripts, not timed tests."""
