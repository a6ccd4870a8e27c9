"""The adversarial corpus: candidate files are data, never test modules."""

collect_ignore = ["candidates"]
