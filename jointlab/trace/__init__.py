"""Tracing: turn a model and a training step into one joint forward+backward FX graph (make_fx and AOT modes)."""
