"""Repository-level pytest configuration: keep evolution output out of collection."""

collect_ignore = ["population", "build"]
pytest_plugins = ["pytester"]
