"""The few array operations that differ between the real executor's backends: numpy on the CPU (`NumpyOps`),
torch on the CPU or CUDA (`TorchOps`). The transformer and the paged KV cache compute through them, so one model
code serves both backends.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Array = Any  # a numpy array or a torch tensor, depending on the backend
BACKENDS = ("numpy", "torch")


class NumpyOps:
    name = "numpy"
    device = "cpu"

    def __init__(self, dtype: str = "float32") -> None:
        self.dtype = np.dtype(dtype)

    def tensor(self, a: np.ndarray) -> Array:
        """Floats in the compute dtype, integers and booleans as they are."""
        return a.astype(self.dtype) if a.dtype.kind == "f" else a

    def numpy(self, x: Array) -> np.ndarray:
        return np.asarray(x)

    def zeros(self, shape: tuple[int, ...]) -> Array:
        return np.full(shape, 0, dtype=self.dtype)  # written, so no page faults later inside a timed step

    def cat(self, xs: list[Array], axis: int) -> Array:
        return xs[0] if len(xs) == 1 else np.concatenate(xs, axis=axis)

    def permute(self, x: Array, axes: tuple[int, ...]) -> Array:
        return np.ascontiguousarray(x.transpose(axes))  # numpy's matmul calls BLAS on contiguous operands only

    def take_rows(self, x: Array, index: Array) -> Array:
        return np.take(x, index, axis=0)  # several times faster than x[index] for a 2-D index

    def heads_first(self, x: Array) -> Array:
        """[..., heads, d] → a view [heads, ..., d]."""
        return np.moveaxis(x, -2, 0)

    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        return x * (1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)) * weight

    def silu(self, x: Array) -> Array:
        return x / (1.0 + np.exp(-x))

    def softmax_(self, x: Array) -> Array:
        """In place: a fresh array the size of a prefill's attention scores costs page faults."""
        x -= x.max(-1, keepdims=True)
        np.exp(x, out=x)
        x /= x.sum(-1, keepdims=True)
        return x

    def argmax(self, x: Array) -> np.ndarray:
        return x.argmax(-1)

    def synchronize(self) -> None:
        pass


class TorchOps:
    name = "torch"

    def __init__(self, dtype: str = "float32", device: str = "cpu") -> None:
        import torch

        self.torch = torch
        self.dtype = getattr(torch, dtype)
        self.device = torch.device(device)

    def tensor(self, a: np.ndarray) -> Array:
        t = self.torch.from_numpy(np.ascontiguousarray(a))
        if a.dtype.kind == "f":
            t = t.to(self.dtype)
        return t.to(self.device)

    def numpy(self, x: Array) -> np.ndarray:
        return x.detach().to("cpu", self.torch.float64 if x.is_floating_point() else x.dtype).numpy()

    def zeros(self, shape: tuple[int, ...]) -> Array:
        return self.torch.zeros(shape, dtype=self.dtype, device=self.device)

    def cat(self, xs: list[Array], axis: int) -> Array:
        return xs[0] if len(xs) == 1 else self.torch.cat(xs, dim=axis)

    def permute(self, x: Array, axes: tuple[int, ...]) -> Array:
        return x.permute(axes)

    def take_rows(self, x: Array, index: Array) -> Array:
        return x[index]

    def heads_first(self, x: Array) -> Array:
        return x.movedim(-2, 0)

    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        return x * self.torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight

    def silu(self, x: Array) -> Array:
        return self.torch.nn.functional.silu(x)

    def softmax_(self, x: Array) -> Array:
        return self.torch.softmax(x, dim=-1)

    def argmax(self, x: Array) -> np.ndarray:
        return x.argmax(-1).cpu().numpy()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)


def limit_cpu_threads(threads: int) -> int:
    """Cap the CPU threads of numpy's OpenBLAS (as numpy's wheels bundle it) and of torch, if loaded: on a busy
    machine, multi-threaded BLAS stalls whole steps waiting for a descheduled thread. Returns the previous
    OpenBLAS thread count, or 0 when numpy's BLAS was not found (then set OPENBLAS_NUM_THREADS before Python
    starts)."""
    import ctypes
    import glob
    import os
    import sys

    if threads < 1:
        raise ValueError(f"threads must be ≥ 1, got {threads}")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    previous = 0
    for path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "libscipy_openblas*")):
        lib = ctypes.CDLL(path)
        for suffix in ("64_", ""):
            if hasattr(lib, f"scipy_openblas_set_num_threads{suffix}"):
                previous = getattr(lib, f"scipy_openblas_get_num_threads{suffix}")()
                getattr(lib, f"scipy_openblas_set_num_threads{suffix}")(threads)
    return previous


def make_ops(backend: str = "numpy", dtype: str = "float32", device: str = "cpu") -> NumpyOps | TorchOps:
    if backend == "numpy":
        if device != "cpu":
            raise ValueError(f"the numpy backend runs on the CPU only, not {device!r}")
        return NumpyOps(dtype)
    if backend == "torch":
        return TorchOps(dtype, device)
    raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
