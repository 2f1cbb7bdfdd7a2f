"""What several test folders share: running the suite in a subprocess, report records, ledger files."""
