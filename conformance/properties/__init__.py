"""Metamorphic properties: the catalog of relations and their Hypothesis search."""
