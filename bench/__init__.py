"""headwise's benchmarks: scripts run from the repository root as modules
(``python -m bench.bench_forward``, ``python -m bench.forecasting.bench_forecast``), so they
import the library and bench's own shared modules (``bench.lab``) without path edits."""
