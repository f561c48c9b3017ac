"""Reproductions of the cross tables and figures (one module each)."""
