"""asv ``track_*`` benchmarks of the bytes one data-parallel step all-reduces, per method.

Bytes are deterministic, so they are counted on the CPU at every scale (ClickTrain Sec. 5.3,
PruneTrain Fig. 11): :func:`bench.method_states.allreduce_payload` of each method's model in its
post-pruning state. ``setup_cache`` builds every (model, method) state once and keeps the
numbers; the ``track_*`` methods read them.
"""

from __future__ import annotations

from bench import cases

_SCALE = cases.resolve_scale()
_CASES = [c.name for c in cases.grid("allreduce", _SCALE)]
_IMPLS = list(cases.implementations("allreduce", _SCALE))


class AllreduceBytes:
    """Gradient bytes per iteration per rank, and their fraction of the dense model's."""

    param_names = ["case", "impl"]
    params = (_CASES, _IMPLS)
    timeout = 1200.0

    def setup_cache(self) -> dict:
        """Count the bytes of every (model, method) pair once: ``{(case, impl): row}``."""
        out: dict = {}
        for case, impl in cases.pairs("allreduce", _SCALE):
            row = cases.run_pair(case, impl, _SCALE)
            out[(case.name, impl.name)] = row
        return out

    def setup(self, rows: dict, case: str, impl: str) -> None:
        """Pick this pair's row; skip (NotImplementedError) a pair that could not be counted."""
        row = rows[(case, impl)]
        if row["status"] != "ok":
            raise NotImplementedError(f"{row['status']}: {row['reason']}")
        self.row = row

    def track_payload_bytes(self, rows: dict, case: str, impl: str) -> float:
        """Gradient bytes one rank contributes to the Allreduce of one iteration."""
        return float(self.row["payload_bytes"])

    track_payload_bytes.unit = "bytes"  # type: ignore[attr-defined]

    def track_payload_fraction(self, rows: dict, case: str, impl: str) -> float:
        """That payload as a fraction of the dense model's."""
        return float(self.row["payload_fraction"])

    track_payload_fraction.unit = "fraction of dense"  # type: ignore[attr-defined]

    def track_ring_bytes_per_rank_p8(self, rows: dict, case: str, impl: str) -> float:
        """Bytes each rank sends in a ring Allreduce over 8 ranks: 2 (p - 1) / p times the
        payload (impl.comm_model)."""
        return float(self.row["ring_bytes_per_rank_p8"])

    track_ring_bytes_per_rank_p8.unit = "bytes"  # type: ignore[attr-defined]
