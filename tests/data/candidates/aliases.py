def custom_kernel(data):
    x, y, out = data
    return y[:]
