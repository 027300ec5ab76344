"""A real multi-process job (torch's launcher, gloo on CPU) for tests and bench."""
