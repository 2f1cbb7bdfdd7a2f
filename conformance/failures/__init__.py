"""Failure bundles: shrink a failing comparison, write it as a bundle, replay it against any backend."""
