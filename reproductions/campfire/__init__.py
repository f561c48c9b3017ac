"""Reproductions of the campfire tables and figures (one module each)."""
