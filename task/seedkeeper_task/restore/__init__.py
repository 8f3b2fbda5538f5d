"""The slot task's restore: download, verify, extract."""
