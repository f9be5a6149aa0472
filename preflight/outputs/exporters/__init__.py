"""Where a verdict is read while it stands: the console, Prometheus metrics, `preflight serve`."""
