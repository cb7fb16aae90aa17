"""The plugin's mypkg.kernels: the same names, its own device's implementation."""

BACKEND = "my-device"


def rms_norm(xs, eps=1e-6):
    mean_square = sum(x * x for x in xs) / len(xs)
    return [x / (mean_square + eps) ** 0.5 for x in xs]
