"""Results: the typed records of a results file (written and read back), runs, diffs, benchmark JSON.

Readers of results (reports, ``normconf compare``) use this layer and the case model only."""
