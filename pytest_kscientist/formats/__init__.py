"""Task formats: task.toml, GPU MODE folders, KernelBench files, drawn cases, declarations."""
