"""Every DynamoDB read and write: the slot lifecycle, snapshots, the sweep's index."""
