"""openvino, openvino-default: OpenVINO's CPU runtime running the onnx family's graphs (opt-in).

Importing ``openvino`` sends a usage event through the ``openvino_telemetry`` package (a forked
process posting to Google Analytics, unless the user opted out or CI=true), and that fork, after JAX
has started its threads in the same process, prints JAX's "os.fork() was called" warning. A
conformance run should neither report usage on the user's behalf nor fork: this package imports
openvino with ``openvino_telemetry`` hidden, so OpenVINO takes its own fallback, the telemetry stub it
uses when that package is not installed. Nothing else about OpenVINO changes.
"""

from __future__ import annotations

import sys
from contextlib import suppress

_TELEMETRY = "openvino_telemetry"


def _import_openvino_without_telemetry() -> None:
    if "openvino" in sys.modules:
        return
    saved = {name: mod for name, mod in sys.modules.items() if name.split(".")[0] == _TELEMETRY}
    for name in saved:
        del sys.modules[name]
    sys.modules[_TELEMETRY] = None  # type: ignore[assignment]  # "import openvino_telemetry" raises ImportError
    try:
        # Not installed: the adapter's own import reports it as unavailable, as before.
        with suppress(ImportError):
            import openvino  # noqa: F401
    finally:
        del sys.modules[_TELEMETRY]
        sys.modules.update(saved)


_import_openvino_without_telemetry()
