"""The zoo imports without Hugging Face transformers; its zoo_hf_* tasks say how to get it.

tests/test_zoo.py runs it as ``python tests/programs/zoo_without_transformers.py``. With
``transformers`` made unimportable, it imports pyalloc.bench.zoo first (before
pyalloc.bench.models), checks that every zoo task is a task, and prints ``error:
<message>`` from building a zoo_hf_* task.
"""
from __future__ import annotations

import sys


def main() -> None:
    sys.modules["transformers"] = None          # as if it were not installed
    import pyalloc.bench.zoo                    # imported first, before pyalloc.bench.models
    from pyalloc.bench.models import TASKS

    assert set(pyalloc.bench.zoo.ZOO) <= set(TASKS) and len(pyalloc.bench.zoo.ZOO) >= 9
    try:
        TASKS["zoo_hf_gpt2"].build()
    except RuntimeError as e:
        print("error:", e)


if __name__ == "__main__":
    main()
