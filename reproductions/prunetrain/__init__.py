"""Reproductions of the prunetrain tables and figures (one module each)."""
