"""Reproductions of the sdgp tables and figures (one module each)."""
