"""HIP candidates: their sources read without importing them, the toolchain, the compile gate."""
