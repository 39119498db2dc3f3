"""Code the test suite and the benchmarks (bench/) share."""
