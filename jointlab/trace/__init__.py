"""Tracing: one joint forward+backward FX graph from a model and a training step.

Two modes share one request: make_fx and AOT export with descriptors.
"""
