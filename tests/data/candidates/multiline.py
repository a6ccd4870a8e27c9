def custom_kernel(data):
    raise RuntimeError(
        "at 3:4:\n    acc = tl.dot(a, b)\n    ^\nValueError: unsupported tensor layout"
    )
