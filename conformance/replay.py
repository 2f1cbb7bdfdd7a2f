"""``python -m conformance.replay BUNDLE``: ``normconf replay`` where the normconf script is not on PATH.

The replay itself lives in ``conformance.failures.replay``; this module keeps the short command (and
the one written into bundles saved by earlier versions) working.
"""

import sys

from conformance.failures.replay import main

if __name__ == "__main__":
    sys.exit(main())
