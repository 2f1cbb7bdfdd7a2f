"""Results (and benchmark JSON) rendered into reports; see the report issue."""
