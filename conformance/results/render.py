"""The renderer contract: what a report renderer gets, and how the CLI finds one by format name.

Renderers live outside ``conformance`` (the ``reports`` package) and are found like backends,
through the ``normconf.renderers`` entry-point group: ``html = "reports.html:render"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata

from conformance.results.benchjson import BenchFile
from conformance.results.diff import Thresholds
from conformance.results.runs import Run

GROUP = "normconf.renderers"
# Renderers of the conventions table alone (`normconf conventions`), by format name, like GROUP.
CONVENTIONS_GROUP = "normconf.conventions"


class RendererError(RuntimeError):
    """No renderer for a format, or it failed to load (e.g. its optional dependency is missing)."""


@dataclass(frozen=True)
class ReportInput:
    """Everything a report shows: the runs (shards merged), benchmark files and display choices."""

    runs: tuple[Run, ...]
    benches: tuple[BenchFile, ...] = ()
    baseline: str | None = None
    title: str = "normconf report"
    thresholds: Thresholds = field(default_factory=Thresholds)


Renderer = Callable[[ReportInput], str]


def formats(group: str = GROUP) -> list[str]:
    return sorted({ep.name for ep in metadata.entry_points(group=group)})


def find_renderer(fmt: str, group: str = GROUP) -> Renderer:
    found = [ep for ep in metadata.entry_points(group=group) if ep.name == fmt]
    if not found:
        allowed = ", ".join(formats(group)) or "(no renderer installed)"
        raise RendererError(f"--format={fmt!r} is not allowed; allowed: {allowed}")
    try:
        renderer = found[0].load()
    except ImportError as exc:
        raise RendererError(
            f"the {fmt} renderer ({found[0].value}) failed to load: {exc}; "
            "install the report extra: pip install 'normconf[report]'"
        ) from exc
    if not callable(renderer):
        raise RendererError(f"the {fmt} renderer {found[0].value} is not callable")
    return renderer  # type: ignore[no-any-return]
