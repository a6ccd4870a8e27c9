"""The GPU Kernel Scientist loop: selector, experiment designer and kernel writer (``--evolve``)."""
