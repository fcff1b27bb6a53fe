"""Exceptions raised by pyalloc."""
from __future__ import annotations

import torch

# torch.OutOfMemoryError (2.5+) is what training code catches; older releases only have
# the CUDA-specific name, which is the same class.
_TorchOOM = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


class PyallocError(RuntimeError):
    """An allocator operation was refused: bad pointer, bad size, bad state."""


class OutOfMemoryError(_TorchOOM):
    """No memory could be found or reclaimed for a request.

    A subclass of ``torch.OutOfMemoryError``, so ``except torch.OutOfMemoryError`` catches
    it. The message is pyalloc's report: the request, the budget, allocated, cached and
    fragmented bytes, and the option most likely to help.
    """


class HostPoolFullError(PyallocError):
    """A swap-out found no room in the host pool (option ``host_pool``)."""


class SwapCopyError(PyallocError):
    """The device refused to start a swap copy. Nothing was lost: a failed swap-out leaves
    the device block as it was, a failed swap-in leaves the host copy intact."""
