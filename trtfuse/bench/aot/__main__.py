"""`python -m trtfuse.bench.aot compile|check`: the commands of cli.py."""

import sys

from trtfuse.bench.aot.cli import main

sys.exit(main())
