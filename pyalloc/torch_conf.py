"""PyTorch's allocator configuration, read by pyalloc.

Users come with ``PYTORCH_CUDA_ALLOC_CONF`` (or its newer name ``PYTORCH_ALLOC_CONF``)
already set: ``expandable_segments:True``, ``max_split_size_mb:512``... Under
``pyalloc.install()`` PyTorch's caching allocator no longer serves device memory, so those
keys would silently stop meaning anything. pyalloc reads them instead:

* keys with a pyalloc meaning become pyalloc options (:data:`TRANSLATED`);
* keys that configure what pyalloc leaves to PyTorch (the pinned host allocator) are left
  to PyTorch (:data:`LEFT_TO_PYTORCH`);
* every other key is refused, with the pyalloc equivalent or the reason there is none
  (:data:`NO_EQUIVALENT`), so nothing the user asked for is dropped without a word.

They rank below pyalloc's own settings: keyword arguments, then ``PYALLOC_<NAME>``, then
``PYALLOC_CONF``, then these. Where both variables are set, ``PYTORCH_ALLOC_CONF`` is read,
as PyTorch does. ``install(torch_alloc_conf=False)`` ignores them.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Tuple

VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def _bool(key: str, value: str) -> str:
    lowered = value.strip().lower()
    if lowered in ("true", "1"):
        return "true"
    if lowered in ("false", "0"):
        return "false"
    raise ValueError(f"{key} must be True or False, got {value!r}")


def _mib(key: str, value: str) -> str:
    try:
        mib = int(value)
    except ValueError:
        raise ValueError(f"{key} must be a whole number of MiB, got {value!r}") from None
    if mib <= 20:
        # PyTorch's own rule: blocks up to 20 MiB are always split.
        raise ValueError(f"{key} must be more than 20 (MiB), got {mib}")
    return f"{mib}MiB"


def _fraction(key: str, value: str) -> str:
    try:
        fraction = float(value)
    except ValueError:
        raise ValueError(f"{key} must be a number in (0, 1], got {value!r}") from None
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"{key} must be in (0, 1], got {fraction}")
    return repr(fraction)


# PyTorch key -> (pyalloc option, converter of the value).
TRANSLATED: Dict[str, Tuple[str, Callable[[str, str], str]]] = {
    "expandable_segments": ("expandable", _bool),
    "max_split_size_mb": ("max_split_size", _mib),
    "per_process_memory_fraction": ("budget", _fraction),
}

# Keys of PyTorch's pinned host allocator, which pyalloc does not replace.
LEFT_TO_PYTORCH = frozenset({
    "pinned_use_cuda_host_register", "pinned_num_register_threads",
    "pinned_use_background_threads", "pinned_reserve_segment_size_mb",
    "pinned_use_host_register",
})

NO_EQUIVALENT: Dict[str, str] = {
    "garbage_collection_threshold": (
        "pyalloc keeps freed segments cached until a request needs their room, then "
        "releases them (the release rung), so there is no threshold-triggered collection; "
        "to keep the cache small, set a budget, or call torch.cuda.empty_cache()"),
    "roundup_power2_divisions": (
        "pyalloc rounds requests to 512 bytes and sizes segments itself; the fragmentation "
        "this works around is what its stitching and expandable segments address "
        "(options stitch, expandable)"),
    "release_lock_on_cudamalloc": (
        "pyalloc's engine has its own lock discipline (docs/design.md, Locks) and no "
        "equivalent switch"),
    "backend": (
        "pyalloc replaces PyTorch's allocator backend; backend:native names the allocator it "
        "stands in for and is accepted, cudaMallocAsync cannot be combined with it"),
    "graph_capture_record_stream_reuse": "pyalloc has no equivalent",
}


def read(environ: Mapping[str, str]) -> Tuple[str, Dict[str, str]]:
    """The variable in force (``""`` if none) and the pyalloc options its keys translate to.

    Raises ``ValueError`` naming every key that has no pyalloc equivalent, and why."""
    variable = next((v for v in VARIABLES if environ.get(v, "").strip()), "")
    if not variable:
        return "", {}
    options: Dict[str, str] = {}
    refused: List[str] = []
    for item in filter(None, (part.strip() for part in environ[variable].split(","))):
        key, sep, value = (x.strip() for x in item.partition(":"))
        if not sep:
            refused.append(f"{item!r} is not key:value")
        elif key in TRANSLATED:
            option, convert = TRANSLATED[key]
            try:
                options[option] = convert(key, value)
            except ValueError as error:
                refused.append(str(error))
        elif key in LEFT_TO_PYTORCH or (key == "backend" and value.lower() == "native"):
            continue
        elif key in NO_EQUIVALENT:
            refused.append(f"{key}: {NO_EQUIVALENT[key]}")
        else:
            refused.append(f"{key}: not a key pyalloc knows")
    if refused:
        raise ValueError(
            f"{variable} has settings pyalloc cannot honour under pyalloc.install():\n  - " +
            "\n  - ".join(refused) +
            f"\nRemove them from {variable} (pyalloc honours "
            f"{', '.join(sorted(TRANSLATED))}), or call install(torch_alloc_conf=False) to "
            f"ignore the variable.")
    return variable, options
