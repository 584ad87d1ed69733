"""`python -m k3core` is the `k3` command."""
import sys

from .cli import main

sys.exit(main())
