"""The CUDA driver's own view of what the engine says it mapped, through cuda-python.

tests/test_gpu.py runs it as ``python tests/programs/gpu_driver_view.py`` (needs a GPU and
``cuda.bindings``, in the ``gpu`` extra). It asks the driver, not the engine: every 2 MiB
chunk of every segment pyalloc's snapshot lists, and of every stitched range and its
pieces, is mapped read-write for the device (``cuMemGetAccess``); the address space an
expandable segment has reserved past its end is not; a stitched range's addresses stop
being mapped when it goes; and the device's used memory (``cuMemGetInfo``) covers what
pyalloc reserves. Prints ``ok`` at the end.
"""
from __future__ import annotations

import torch
from cuda.bindings import driver

import pyalloc

MiB = 1 << 20
CHUNK = 2 * MiB
READ_WRITE = int(driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)


def access(address: int) -> int:
    """The device's access flags at ``address``; 0 where nothing is mapped (the driver
    answers an error there)."""
    location = driver.CUmemLocation()
    location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    location.id = torch.cuda.current_device()
    err, flags = driver.cuMemGetAccess(location, address)
    return int(flags) if err == driver.CUresult.CUDA_SUCCESS else 0


def used_on_device() -> int:
    err, free, total = driver.cuMemGetInfo()
    assert err == driver.CUresult.CUDA_SUCCESS, err
    return total - free


def check_mapped(address: int, size: int, what: str) -> None:
    for chunk in range(address, address + size, CHUNK):
        assert access(chunk) == READ_WRITE, (what, hex(chunk), access(chunk))


def check_snapshot() -> None:
    snap = pyalloc.snapshot()
    for seg in snap["segments"]:
        check_mapped(seg["address"], seg["total_size"], "segment")
        reserved = seg.get("reserved_address_space", seg["total_size"])
        if seg["expandable"] and reserved > seg["total_size"]:
            past = seg["address"] + seg["total_size"]
            assert access(past) == 0, ("reserved past the end of an expandable segment, mapped",
                                       hex(past))
    for rng in snap["stitched"]:
        size = sum(s for _, s in rng["pieces"])
        check_mapped(rng["address"], size, "stitched range")
        for address, piece in rng["pieces"]:
            check_mapped(address, piece, "stitched piece")
    reserved = pyalloc.memory_stats()["reserved_bytes.all.current"]
    assert used_on_device() >= reserved, (used_on_device(), reserved)


def main() -> None:
    pyalloc.install(device="cuda", budget="40MiB", expandable=True)
    blocks = [torch.full((4 * MiB,), i, dtype=torch.uint8, device="cuda") for i in range(10)]
    survivors = blocks[0::2]
    del blocks
    check_snapshot()
    big = torch.empty(12 * MiB, dtype=torch.uint8, device="cuda")   # no hole holds it: stitched
    big.fill_(99)
    torch.cuda.synchronize()
    assert pyalloc.memory_stats()["num_stitches"] == 1
    stitched = pyalloc.snapshot()["stitched"]
    assert len(stitched) == 1 and stitched[0]["address"] == big.data_ptr(), stitched
    check_snapshot()
    address = big.data_ptr()
    del big                                   # kept mapped for the same stitch (keep_stitched)
    torch.cuda.synchronize()
    assert pyalloc.snapshot()["stitched"] == []
    assert pyalloc._engine(None).stats()["kept_stitched_ranges"] == 1
    assert access(address) == READ_WRITE, "a kept stitched range is not mapped"
    del survivors[-1]
    pyalloc.empty_cache()                     # trims the expandable segment's free tail,
    assert access(address) == 0, "a stitched range still mapped after a release"  # kept first
    assert pyalloc._engine(None).stats()["kept_stitched_ranges"] == 0
    check_snapshot()
    print("ok")


if __name__ == "__main__":
    main()
