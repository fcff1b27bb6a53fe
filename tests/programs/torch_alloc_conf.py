"""install() reads PYTORCH_CUDA_ALLOC_CONF (pyalloc/torch_conf.py).

Run by tests/test_options.py in a fresh interpreter (install() is once a process):
    python tests/programs/torch_alloc_conf.py
A key with no pyalloc meaning makes install() refuse and leaves nothing installed; keys
with one become options of the installed engine.
"""
import os

import pyalloc

os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "garbage_collection_threshold:0.5"
try:
    pyalloc.install(device="cpu")
except ValueError as error:
    print("refused", "garbage_collection_threshold" in str(error), pyalloc.is_installed())
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True,max_split_size_mb:64"
pyalloc.install(device="cpu")
print("options", pyalloc._engine().options_string)
