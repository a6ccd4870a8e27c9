def kernel(data):
    return data[2]
