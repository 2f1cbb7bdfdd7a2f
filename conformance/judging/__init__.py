"""Judging: the tolerance matrix, scales and conditioning, comparison figures, the ledger, messages.

Given a case, the oracle's outputs and a backend's outputs, this layer decides passed / failed / xfailed."""
