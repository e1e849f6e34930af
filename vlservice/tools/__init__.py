"""Tools that measure, compare or build for the service (benchmarks, soak, memory, test
checkpoints); they may import the engine, never the other way round."""
