"""The HTTP surface: the resolver every function URL shares and the one answer table."""
