"""The node id of a suite test, shared by the plugin (crash records) and the scheduler (scopes)."""

from __future__ import annotations

import re

# The check, then the backend and the case id (or a fingerprint question or property name).
NODE_ID = re.compile(r"::test_(?P<check>\w+)\[(?P<backend>[a-z0-9-]+):(?P<case>[^\]]+)\]$")
