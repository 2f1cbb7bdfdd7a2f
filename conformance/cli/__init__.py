"""The ``normconf`` command: argument parsing, its commands, and the pytest subprocess it follows."""
