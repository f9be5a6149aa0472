"""The report as one self-contained HTML page: `preflight report --html` and serve's `/`."""
