"""A module that copies from mypkg.kernels when it is imported (as vLLM's layers copy from
vllm._custom_ops)."""

from mypkg.kernels import BACKEND, rms_norm


def norm(xs):
    return BACKEND, rms_norm(xs)
