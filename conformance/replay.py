"""``python -m conformance.replay BUNDLE --backend NAME``: the documented command that bundles print.

The replay itself lives in ``conformance.failures.replay``; this module keeps the short command (and
the one written into bundles saved by earlier versions) working.
"""

import sys

from conformance.failures.replay import main

if __name__ == "__main__":
    sys.exit(main())
