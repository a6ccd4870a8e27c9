"""The candidate worker process: the only package code that runs beside candidate code."""
