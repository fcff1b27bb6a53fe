"""pyalloc.install() with a policy when another library holds the registry's dispatch key.

tests/test_dispatch.py runs it as ``python tests/programs/dispatch_key_taken.py``. Before
importing pyalloc it takes the DeferredInit dispatch key with a fallthrough fallback, as
torchdistx's deferred_init would. It prints the refusal of ``install(policy="recompute")``
(``refused: <message on one line>``), whether that failed install left pyalloc installed,
whether a plain install (no policy, so no dispatch key) then trains, and whether the
scoped form is refused too.
"""
from __future__ import annotations

import torch


def main() -> None:
    # Taken before pyalloc is imported, as by a library imported first; held to the end.
    squatter = torch.library.Library("_", "IMPL", "DeferredInit")
    squatter.fallback(torch.library.fallthrough_kernel)
    import pyalloc

    try:
        pyalloc.install(device="cpu", budget="1GiB", policy="recompute")
        print("installed")
    except RuntimeError as e:
        print("refused:", str(e).replace(chr(10), " "))
    print("installed after", pyalloc.is_installed())
    # Without a policy pyalloc works as ever: the allocator needs no dispatch key.
    pyalloc.install(device="cpu", budget="1GiB")
    x = torch.randn(256, 256, requires_grad=True)
    (x * 2).sum().backward()
    print("trained", bool(torch.equal(x.grad, torch.full_like(x, 2.0))))
    try:
        with pyalloc.recompute():
            pass
    except RuntimeError as e:
        print("scoped refused too:", "DeferredInit" in str(e))


if __name__ == "__main__":
    main()
