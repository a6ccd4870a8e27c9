# Right on its first call, wrong from the second on: nothing kept between calls.
CALLS = [0]


def custom_kernel(data):
    x, y, out = data
    CALLS[0] += 1
    out.copy_(2 * x + y if CALLS[0] == 1 else 2 * x + y + 1)
    return out
