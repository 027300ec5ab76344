"""Memory analyses: predicted lifetimes, measured allocations, what-if partitions, sizes."""
