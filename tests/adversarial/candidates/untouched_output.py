"""Attack: do no work and hand back the preallocated output as it came."""


def custom_kernel(data):
    return data[4]
