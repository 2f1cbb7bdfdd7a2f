"""docs/architecture.md against the code: the layout names every folder and only paths that exist, the
layer picture is the import contract's layers, the families are the backend subpackages."""

from __future__ import annotations

import re
import tomllib

from support.suite import ROOT

DOC = (ROOT / "docs" / "architecture.md").read_text()
# Folders below these roots that are not code: caches, test data.
NOT_ON_THE_MAP = {"__pycache__", "data"}


def _block(heading: str, text: str = DOC) -> str:
    """The first code block after ``heading``."""
    found = re.search(re.escape(heading) + r"\n.*?```\n(.*?)```", text, re.S)
    assert found, heading
    return found[1]


def layout_paths(block: str) -> set[str]:
    """The paths the layout names: a line's names (before two spaces) under the folders it is indented in."""
    paths: set[str] = set()
    stack: list[str] = []
    for line in block.splitlines()[1:]:  # the first line lists the root's files
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent >= 20:  # a description continued on the next line
            continue
        names = re.split(r"\s{2,}", line.strip())[0].split(" ")
        stack = stack[: indent // 2]
        paths |= {"/".join([*stack, name.rstrip("/")]) for name in names}
        if len(names) == 1 and names[0].endswith("/"):
            stack.append(names[0].rstrip("/"))
    return paths


def folders() -> set[str]:
    """Every code folder of conformance/, backends/ and reports/, and the folders of tests/ (one level)."""
    found = {
        str(p.relative_to(ROOT))
        for root in ("conformance", "backends", "reports")
        for p in (ROOT / root).rglob("*")
        if p.is_dir() and not NOT_ON_THE_MAP & set(p.parts)
    }
    tests = (p for p in (ROOT / "tests").iterdir() if p.is_dir() and p.name not in NOT_ON_THE_MAP)
    return found | {str(p.relative_to(ROOT)) for p in tests}


def _rows(picture: str) -> list[str]:
    """The layer rows of the picture: the text before the description, until the first blank line."""
    rows = []
    for line in picture.split("\n\n")[0].splitlines():
        names = re.match(r"\s*(\w+(?:\s*\|\s*\w+)*)", line)
        assert names, line
        rows.append(" | ".join(part.strip() for part in names[1].split("|")))
    return rows


def test_every_path_on_the_map_exists():
    missing = sorted(
        p for p in layout_paths(_block("## Layout and dependency direction")) if not (ROOT / p).exists()
    )
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_folder_is_on_the_map():
    absent = sorted(folders() - layout_paths(_block("## Layout and dependency direction")))
    assert not absent, f"folders missing from docs/architecture.md's layout: {absent}"


def test_a_folder_left_off_the_map_is_seen():
    """The check above can fail: the layout without its judging/ line misses that folder."""
    block = _block("## Layout and dependency direction")
    cut = "\n".join(line for line in block.splitlines() if not line.startswith("  judging/"))
    assert "conformance/judging" in folders() - layout_paths(cut)


def test_the_layer_picture_is_the_layers_contract():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (layers,) = [c["layers"] for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "layers"]
    assert _rows(_block("### The layers")) == layers


def test_the_families_are_the_backend_subpackages_and_their_test_folders():
    picture = _block("### The layers")
    line = next(line for line in picture.splitlines() if line.rstrip().endswith("(families)"))
    families = {name.strip() for name in line.replace("(families)", "").split("|")}
    packages = {p.name for p in (ROOT / "backends").iterdir() if (p / "__init__.py").exists()} - {"common"}
    tests = {p.name for p in (ROOT / "tests" / "backends").iterdir() if p.is_dir()} - NOT_ON_THE_MAP
    assert families == packages == tests


def test_each_layer_has_its_test_folder():
    layers = {p.name for p in (ROOT / "conformance").iterdir() if (p / "__init__.py").exists()}
    untested = sorted(name for name in layers if not any((ROOT / "tests" / name).glob("test_*.py")))
    assert not untested, f"conformance layers without a tests/<layer> folder: {untested}"
