"""Stepping: run a joint graph node by node with breakpoints, timings and its own RNG stream."""
