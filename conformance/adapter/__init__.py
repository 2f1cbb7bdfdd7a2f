"""The adapter layer: the Backend contract, the registry that finds adapters, and guarded execution.

``execute`` runs an adapter under a deadline and validates what it returns; nothing here judges numbers."""
