"""docs/adding-a-backend.md's files: what the guide tells a user to write, read back from the guide."""

from __future__ import annotations

import re

from support.suite import ROOT

DOC = ROOT / "docs" / "adding-a-backend.md"


def guide_files() -> dict[str, str]:
    """Code blocks of the guide whose first line is ``# file: NAME``."""
    files = {}
    for block in re.findall(r"```\w*\n(.*?)```", DOC.read_text(), flags=re.S):
        first, _, rest = block.partition("\n")
        match = re.fullmatch(r"# file: (\S+)", first.strip())
        if match:
            files[match[1]] = rest
    return files
