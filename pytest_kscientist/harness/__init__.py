"""The pytest process: collection, sessions, verdicts, timing statistics, reports, gates."""
