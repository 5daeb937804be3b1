"""Concrete semantics: the exact interpreter of a step and the per-group views it uses."""
