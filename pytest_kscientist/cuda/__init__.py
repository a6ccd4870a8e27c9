"""CUDA candidates compiled where they cannot run (``compile_gate``)."""
