"""TEST DOUBLE of the sglang.benchmark package (0.5.15 on: where the benchmark client lives)."""
