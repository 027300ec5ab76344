"""Memory analyses: predicted lifetimes, measured allocations, what-if and dynamic sizes."""
