"""``python -m conformance.cli``: the ``normconf`` command without its console script."""

import sys

from conformance.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
