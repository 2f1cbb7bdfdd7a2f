"""Running the suite: options and settings, the checks table, the pytest plugin, scheduling, sharding."""
