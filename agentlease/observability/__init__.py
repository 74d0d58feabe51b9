"""What an operator sees of the leases: metrics, traces and the runs' search attributes (``docs/metrics.md``,
``docs/tracing.md``, ``docs/operator-views.md``)."""
