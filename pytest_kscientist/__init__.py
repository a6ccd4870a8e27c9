"""pytest-kscientist: GPU-kernel tasks as honest pytest suites, evolved by a Kernel Scientist.

Importing this package imports neither torch nor any candidate code.
"""

__version__ = "0.1.0"
