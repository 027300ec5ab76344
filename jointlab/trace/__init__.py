"""Tracing: a model and a training step into one joint forward+backward FX graph.

``trace()`` (tracer.py) dispatches to the make_fx mode (make_fx.py) or the AOT
mode (aot.py); request.py holds what both modes share.
"""
