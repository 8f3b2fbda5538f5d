"""What each function does: one call per request, returning domain outcomes."""
