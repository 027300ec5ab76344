"""Comparison with eager autograd: eager capture, pairing and verdicts."""
