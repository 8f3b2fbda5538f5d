"""Seedkeeper: seed coding sandboxes from repository snapshots, and never let an idle
deadline erase a seeded sandbox's unpublished work."""

__version__ = "0.1.0"
