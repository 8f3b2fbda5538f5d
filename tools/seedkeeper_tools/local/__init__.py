"""The local stack: everything Seedkeeper needs, on one machine, with no AWS account."""
