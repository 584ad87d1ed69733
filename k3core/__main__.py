"""`python -m k3core` is the `k3` command."""
import sys

from .cli.main import main

sys.exit(main())
