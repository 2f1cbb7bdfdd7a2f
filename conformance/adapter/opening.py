"""Opening a registered backend: loaded with its capabilities, unavailable here, or broken.

Someone else's adapter may be broken (it fails to import, to construct, or in ``capabilities()``):
that is that adapter's problem. Opening never raises for the adapter: it says *why* the backend cannot
run, and whether that is an unavailability (a missing optional library, no device: its tests are
skipped) or a defect (its tests are errors), with the exception's type, message and location.
"""

from __future__ import annotations

import difflib
import traceback
from collections.abc import Collection
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.version import InvalidVersion, Version

from conformance.adapter.backend import Backend, BackendUnavailable, Capabilities
from conformance.adapter.registry import BackendLoadError, Entry
from conformance.model.case import FEATURES, OPS
from conformance.model.dtypes import DTYPES

# The extra that installs the libraries of a built-in adapter, by the top-level module that is missing.
EXTRAS: dict[str, str] = {
    "torch": "torch",
    "triton": "triton",
    "onnx": "onnx",
    "onnxruntime": "onnx",
    "onnxscript": "onnx",
    "jax": "flax",
    "jaxlib": "flax",
    "flax": "flax",
    "keras": "keras",
    "openvino": "openvino",
    "transformers": "transformers",
}


# The lowest release of each library the built-in adapters are tested with: the floors of pyproject's
# extras (tests/adapter/test_adapter_floors.py keeps the two equal). An older release may install and import,
# yet compute otherwise (Keras before 3.11 takes LayerNormalization's variance in one pass on its
# torch backend): such a backend is unavailable with that reason, not a run of surprising failures.
FLOORS: dict[str, str] = {
    "torch": "2.6",
    "triton": "3.2",
    "onnx": "1.18",
    "onnxruntime": "1.27",
    "onnxscript": "0.6.1",
    "jax": "0.4.30",
    "jaxlib": "0.4.30",
    "flax": "0.10",
    "keras": "3.11",
    "openvino": "2025.0",
    "transformers": "4.48",
}


@dataclass(frozen=True)
class Absent:
    """Why a backend cannot run. ``broken``: a defect in the adapter (its tests are errors); otherwise
    it is unavailable on this machine (its tests are skipped). ``detail`` is the cause alone."""

    name: str
    detail: str
    broken: bool

    @property
    def outcome(self) -> str:
        return "error" if self.broken else "skipped"

    @property
    def reason(self) -> str:
        """The reason its tests carry."""
        state = "is broken" if self.broken else "unavailable"
        return f"backend {self.name} {state}: {self.detail}"


Opened = tuple[Backend, Capabilities] | Absent


def located(exc: BaseException) -> str:
    """``Type: message (at file:line in function)``, the innermost frame of the exception."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = (
        f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    )
    return f"{type(exc).__name__}: {exc}{where}"


def _missing_dependency(entry: Entry, cause: BaseException) -> str | None:
    """The install hint when an adapter's import failed on a library other than the adapter itself."""
    if not isinstance(cause, ModuleNotFoundError) or not cause.name:
        return None
    own = entry.module
    missing = cause.name
    if own and (own == missing or own.startswith(missing + ".")):
        return None  # the entry point names a module that is not there: the package is broken
    top = missing.split(".", 1)[0]
    extra = EXTRAS.get(top)
    install = f"pip install 'normconf[{extra}]'" if extra else f"pip install {top}"
    return f"needs {top}, which is not installed ({install})"


def _too_old(entry: Entry, caps: Capabilities) -> str | None:
    """For a built-in adapter: the first library it uses (every built-in adapter names the libraries it
    runs on in its notes, with their versions) whose installed release is below its floor."""
    if not entry.module.startswith("backends."):
        return None  # a third party's adapter states its own requirements
    for library, floor in FLOORS.items():
        if library not in caps.notes:
            continue
        try:
            installed = metadata.version(library)
            old = Version(installed) < Version(floor)
        except (metadata.PackageNotFoundError, InvalidVersion):
            continue
        if old:
            extra = EXTRAS.get(library, library)
            return (
                f"needs {library}>={floor}, {installed} is installed "
                f"(pip install --upgrade 'normconf[{extra}]')"
            )
    return None


# Short dtype names people type from habit, for the did-you-mean of a capability.
_DTYPE_ALIASES = {
    "fp64": "float64",
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "half": "float16",
}


def _unknown_names(caps: Capabilities) -> str | None:
    """Every capability field naming something the suite does not know (``rmsnorm``, ``fp32``): such
    a backend would run as all-unsupported and test nothing, so it is refused as broken."""
    fields: tuple[tuple[str, Collection[str], tuple[str, ...]], ...] = (
        ("ops", caps.ops, OPS),
        ("dtypes", caps.dtypes, DTYPES),
        ("features", caps.features, FEATURES),
    )
    problems = []
    for field, declared, allowed in fields:
        unknown = sorted(str(name) for name in declared if name not in allowed)
        if not unknown:
            continue
        hints = []
        for name in unknown:
            guess = _DTYPE_ALIASES.get(name.lower()) if field == "dtypes" else None
            guess = guess or next(iter(difflib.get_close_matches(name, allowed, n=1)), None)
            hints.append(f"{name!r}" + (f" (did you mean {guess!r}?)" if guess else ""))
        problems.append(
            f"{field}={', '.join(hints)}, which the suite does not know; allowed: {', '.join(allowed)}"
        )
    return f"capabilities() declares {'; '.join(problems)}" if problems else None


def open_backend(entry: Entry) -> Opened:
    """Load ``entry`` and ask its capabilities; any failure becomes an Absent with its reason."""
    name = entry.name
    try:
        backend = entry.load()
    except BackendLoadError as exc:
        cause = exc.__cause__
        if isinstance(cause, BackendUnavailable):
            return Absent(name, str(cause), broken=False)
        hint = _missing_dependency(entry, cause) if cause is not None else None
        if hint is not None:
            return Absent(name, hint, broken=False)
        detail = located(cause) if cause is not None else str(exc)
        return Absent(name, f"{entry.origin} failed to load: {detail}", broken=True)
    try:
        caps = backend.capabilities()
    except BackendUnavailable as exc:
        return Absent(name, str(exc), broken=False)
    except Exception as exc:
        return Absent(name, f"capabilities() raised {located(exc)}", broken=True)
    if not isinstance(caps, Capabilities):
        what = type(caps).__name__
        return Absent(name, f"capabilities() returned {what}, not Capabilities", broken=True)
    unknown = _unknown_names(caps)
    if unknown is not None:
        return Absent(name, unknown, broken=True)
    old = _too_old(entry, caps)
    if old is not None:
        return Absent(name, old, broken=False)
    return backend, caps
