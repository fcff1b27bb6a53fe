# Shared preamble: AUDIT_SNAP=1 loads pyalloc from the HEAD snapshot in /tmp/audit/snap (the working tree
# may be mid-edit); default: whatever `import pyalloc` finds (the /work/main working tree).
import os, sys
if os.environ.get("AUDIT_SNAP") == "1":
    sys.path.insert(0, "/tmp/audit"); import snapimport  # noqa
import torch, pyalloc
pyalloc.install(device="cpu", budget="1GiB", policy="recompute")
from pyalloc import registry
reg = registry.active()
def node(t): return reg.node_of(t) is not None
