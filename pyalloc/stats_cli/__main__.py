"""``python -m pyalloc.stats_cli`` is ``pyalloc-stats``."""
import sys

from . import main

sys.exit(main())
