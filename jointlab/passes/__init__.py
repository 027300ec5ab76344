"""Graph passes: the only code that writes ``node.meta`` (annotation, analysis, repairs)."""
