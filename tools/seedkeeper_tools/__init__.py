"""Developer tools: the `seedkeeper` command, the demo, the local stack, the executor's
client and publishing. Never shipped to Lambda."""
