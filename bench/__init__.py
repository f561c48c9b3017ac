"""pdtbench's benchmark suites: one module of cases, two runners (asv and pytest-benchmark).

``bench.cases`` holds every case (a grid of cases times a dict of implementations) and turns a
measurement into a tidy row with its provenance; ``bench.measure`` times (CUDA events on a
GPU, ``time.perf_counter`` on the CPU); ``bench.peaks`` is the table of GPU peaks;
``bench.run`` writes rows as CSV and JSON (``python -m bench.run --scale smoke --out DIR``).
The asv benchmarks are the ``bench/asv_*.py`` modules (``benchmark_dir`` of ``asv.conf.json``);
the pytest-benchmark suite is ``bench/pytest_suite/`` (not a package, so asv does not import
it). See docs/benchmarks.md.

Nothing here touches a GPU at import time.
"""


class Unavailable(NotImplementedError):
    """A case or implementation that cannot run here; ``str(exc)`` says why.

    A subclass of ``NotImplementedError``, which asv reads as "skip" when a ``setup`` raises
    it; the pytest suite turns it into ``pytest.skip(reason)``; ``bench.run`` records a row
    with ``status="skipped"`` and the reason. Never silent.
    """


__all__ = ["Unavailable"]
