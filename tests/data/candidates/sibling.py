# Imports a module of its folder, as a kernel split over two files would.
from good_helper import custom_kernel  # noqa: F401
