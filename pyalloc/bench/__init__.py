"""The lab: the models, tasks, allocation patterns and benchmarks pyalloc is measured with.

Not needed to use pyalloc — ``import pyalloc`` never imports it. ``pip install
'pyalloc[bench]'`` adds what some of its tasks need (Hugging Face ``transformers`` for the
zoo's GPT-2, Llama and BERT; ResNet-50 also needs ``torchvision``, which is left to you, as
it must match your torch).

* :mod:`~pyalloc.bench.tasks` (a model and its seeded data), :mod:`~pyalloc.bench.models`
  (the suite's models and every task, ``TASKS``), :mod:`~pyalloc.bench.zoo` (the shapes
  users bring), :mod:`~pyalloc.bench.patterns` (seeded allocation patterns);
* :mod:`~pyalloc.bench.trial`, the training loop every benchmark runs: timed steps, and a
  trial under a budget that reports running out of memory or thrashing and leaves the
  model trainable;
* the benchmarks, each a program (``python -m pyalloc.bench.NAME``, or
  ``tools/NAME.py``): :mod:`~pyalloc.bench.suite` (``pyalloc-bench``, head to head),
  :mod:`~pyalloc.bench.remat`, :mod:`~pyalloc.bench.swap`, :mod:`~pyalloc.bench.frag`,
  :mod:`~pyalloc.bench.alloc`, :mod:`~pyalloc.bench.inplace`,
  :mod:`~pyalloc.bench.profile_registry`; :mod:`~pyalloc.bench.native_model` models
  PyTorch's own caching allocator for the fragmentation benchmark;
  :mod:`~pyalloc.bench.results` writes what they measured, naming the device.
"""
