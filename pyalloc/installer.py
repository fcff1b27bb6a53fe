"""``pyalloc.install()``: make PyTorch allocate through pyalloc.

On a GPU, pyalloc's library is loaded with ``torch.cuda.memory.CUDAPluggableAllocator``
and made the current CUDA allocator, with its hooks wired to ``torch.cuda.empty_cache``,
``set_per_process_memory_fraction`` and ``Tensor.record_stream``. PyTorch allows that
only before CUDA is initialized, hence "call install() before the model is created".

Without a GPU (or with ``device="cpu"``), pyalloc installs the *simulated device*: a c10
CPU allocator (the CPU shim) serves every PyTorch CPU tensor from an engine over host
memory, under the same budget and with the same stats, so the whole stack runs and is
tested on a laptop or in CI.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Any, Optional

import torch

from . import _lib, _torch_shim, compiled, graphs, inplace, lifetime, registry, state
from .errors import PyallocError
from .options import Budget, build_options, effective
from .publish import StatsPublisher
from .torch_compat import patch_torch_cuda

log = logging.getLogger("pyalloc")

# Kept importable from here too (the state itself lives in pyalloc.state).
installed_device = state.installed_device
is_installed = state.is_installed


_NO_CUDA_BACKEND = (
    "pyalloc.install({asked}), but this pyalloc build has no CUDA backend: it was configured "
    "with -DPYALLOC_CUDA=OFF. Reinstall pyalloc without that option (the backend needs no CUDA "
    'toolkit), or pass device="cpu" for the simulated device.'
)


def _resolve_device(device: str) -> str:
    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f'device must be "auto", "cuda" or "cpu", got {device!r}')
    has_gpu = torch.cuda.is_available()  # does not initialize CUDA
    if device == "cuda" and not has_gpu:
        raise RuntimeError(
            'pyalloc.install(device="cuda") but PyTorch sees no CUDA GPU '
            "(torch.cuda.is_available() is False). Use device=\"cpu\" for the simulated "
            "device, or install a CUDA build of PyTorch on a machine with a GPU."
        )
    if has_gpu and device != "cpu":
        # "auto" too: the simulated device in the GPU's place would serve none of the model's
        # CUDA tensors, and the user would see no error, only no effect.
        if not _lib.lib().pyalloc_has_cuda_backend():
            where = " on a machine with a GPU" if device == "auto" else ""
            raise RuntimeError(_NO_CUDA_BACKEND.format(asked=f'device="{device}"{where}'))
        return "cuda"
    if device == "auto":
        log.info(
            "pyalloc: no CUDA GPU found; installing the simulated device "
            "(CPU tensors are served by the engine under the budget)"
        )
    return "cpu"


def install(device: str = "auto", budget: Budget = None, *, stats_file: Optional[str] = None,
            stats_interval: float = 1.0, patch_torch: bool = True, torch_alloc_conf: bool = True,
            **options: Any) -> str:
    """Route PyTorch's allocations through pyalloc. Call once, before creating tensors.

    Parameters
    ----------
    device : {"auto", "cuda", "cpu"}
        ``"cuda"``: the GPU allocator. ``"cpu"``: the simulated device (CPU tensors).
        ``"auto"``: CUDA when a GPU is available, else the simulated device.
    budget : int, float or str, optional
        Hard cap on reserved memory: bytes (``8 << 30``), a string (``"8GiB"``), or a
        fraction of device memory (``0.8`` or ``"80%"``). Default: all of it. On the
        simulated device the device holds ``sim_capacity`` bytes (default 4 GiB).
    stats_file : str, optional
        Publish stats to this file every ``stats_interval`` seconds, for
        ``pyalloc-stats watch``. ``"auto"``: ``<tempdir>/pyalloc-stats-<pid>.json``.
        Default: ``$PYALLOC_STATS_FILE``, else off.
    patch_torch : bool
        On CUDA, make ``torch.cuda.memory_stats``, ``memory_allocated``, ``memory_summary``,
        ``reset_peak_memory_stats`` and their kin report pyalloc's figures (under a
        pluggable allocator PyTorch's own raise), and ``_record_memory_history``,
        ``_snapshot``, ``_dump_snapshot`` and the out-of-memory observer work. See
        :mod:`pyalloc.torch_compat`.
    torch_alloc_conf : bool
        Read ``PYTORCH_ALLOC_CONF`` / ``PYTORCH_CUDA_ALLOC_CONF``: keys with a pyalloc
        meaning (``expandable_segments``, ``max_split_size_mb``,
        ``per_process_memory_fraction``) become options, below pyalloc's own settings;
        any other key of PyTorch's device allocator is refused with a message naming the
        equivalent or why there is none (:mod:`pyalloc.torch_conf`). False: ignore them.
    **options
        Any option listed by :func:`pyalloc.options_table`, overriding ``PYALLOC_CONF``.
        ``policy="recompute"`` turns on rematerialization for the thread that calls
        ``install()`` (activations are evicted when memory is short and recomputed on
        use; see :mod:`pyalloc.registry`), tuned by ``evict_strategy``,
        ``evict_threshold``, ``min_evictable`` and ``remat_cost``; what it cannot
        recompute within the budget is copied to host memory unless ``spill=False``
        (``host_pool``, made at the first such copy). ``policy="swap"``
        copies them to a host pool on side streams instead (``host_pool``,
        ``prefetch``); ``policy="hybrid"`` swaps what the copy can hide and recomputes
        the rest.

    Returns
    -------
    str
        The device installed: ``"cuda"`` or ``"cpu"``.

    Raises
    ------
    ValueError
        An unknown option or a value the engine cannot parse (the message names it).
    RuntimeError
        Already installed; CUDA already initialized; ``device="cuda"`` without a GPU.
    """
    if state.is_installed():
        raise RuntimeError(
            f"pyalloc is already installed in this process (device={state.installed_device()!r}); "
            "install() can be called once, before the first tensor is created"
        )
    text = build_options(budget, options, torch_alloc_conf=torch_alloc_conf)
    resolved = _resolve_device(device)
    chosen = effective(text)
    # Before anything is installed, as every bad option is.
    registry.check_spill(chosen["policy"], chosen["spill"] == "true", int(chosen["host_pool"]))
    if chosen["policy"] != "none":
        # Before anything is installed: a dispatch key another library holds (torchdistx)
        # is an error that leaves the process as it was.
        registry.claim_dispatch_key()
    if resolved == "cuda":
        _install_cuda(text)
        graphs.enable()   # CUDA graphs keep their memory (graph-private pools)
        if patch_torch:
            patch_torch_cuda()
    else:
        _install_cpu(text)
    state.set_installed(resolved)
    compiled.enable()   # torch.compile's regions hold their tensors under a policy
    lifetime.arm()   # the model built from here on, and optimizer state, are long-lived
    if chosen["inplace_update"] == "true":
        inplace.enable()
    if chosen["policy"] != "none":
        registry.enable()   # its settings come from the engine's options
    stats_file = stats_file or os.environ.get("PYALLOC_STATS_FILE")
    if stats_file:
        state.keep_alive(StatsPublisher(stats_file, stats_interval).start())
    log.info("pyalloc: installed on %s with options %r", resolved, text)
    return resolved


def _install_cuda(options: str) -> None:
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA is already initialized, so PyTorch no longer lets its allocator be replaced. "
            "Call pyalloc.install() first thing, before any CUDA tensor or model is created "
            "(and before imports that touch the GPU)."
        )
    # The torch shim's entry points raise torch.OutOfMemoryError; libpyalloc's own can only
    # raise RuntimeError. Build the shim first, so a failure leaves nothing installed.
    try:
        path, names = _torch_shim.path(), ("pyalloc_torch_malloc", "pyalloc_torch_free")
    except Exception as e:  # no compiler, no headers: still usable, with a weaker error type
        log.warning("pyalloc: could not build the torch shim (%s); out-of-memory errors will be "
                    "RuntimeError instead of torch.OutOfMemoryError", e)
        path, names = str(_lib.library_path()), ("pyalloc_malloc", "pyalloc_free")
    lib = _lib.lib()
    if lib.pyalloc_install(b"cuda", options.encode()) != 0:
        raise PyallocError(_lib.last_error())
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, *names)
    hooks = allocator.allocator()
    hooks.set_reset_fn(_lib.address_of("pyalloc_empty_cache_hook"))
    hooks.set_memory_fraction_fn(_lib.address_of("pyalloc_memory_fraction_hook"))
    hooks.set_record_stream_fn(_lib.address_of("pyalloc_record_stream_hook"))
    torch.cuda.memory.change_current_allocator(allocator)
    state.keep_alive(allocator)


def _install_cpu(options: str) -> None:
    shim = _torch_shim.load()  # compile first: a build failure must not leave a half install
    lib = _lib.lib()
    if lib.pyalloc_install(b"host", options.encode()) != 0:
        raise PyallocError(_lib.last_error())
    if shim.pyalloc_cpu_shim_install(lib.pyalloc_installed_engine(0)) != 0:
        raise PyallocError("the CPU shim refused to install (null function pointer)")
    _after_fork.register()


class _AfterFork:
    """A forked child (a DataLoader worker) gets simulated-device memory of its own, with the
    parent's contents: Note [The simulated device after fork] in allocator/src/host_backend.cpp.
    Registered once; os.fork() runs it in the child (a fork that execs at once never does),
    after the parent waited for its streams (``_before``): the child has none of the parent's
    stream workers, and work left in flight would never finish there."""

    def __init__(self) -> None:
        self._registered = False

    def register(self) -> None:
        if not self._registered:
            os.register_at_fork(before=self._before, after_in_child=self._in_child)
            self._registered = True

    @staticmethod
    def _before() -> None:
        _lib.lib().pyalloc_before_fork()

    @staticmethod
    def _in_child() -> None:
        if _lib.lib().pyalloc_after_fork_in_child() != 0:
            # The child's memory is still the parent's: it must not go on writing into it.
            sys.stderr.write(f"pyalloc: a forked child could not get memory of its own "
                             f"({_lib.last_error()}); it exits\n")
            os._exit(70)


_after_fork = _AfterFork()
