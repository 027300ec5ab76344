"""Analyses: readers of a traced graph that return DataFrames or frozen dataclasses, never HTML."""
