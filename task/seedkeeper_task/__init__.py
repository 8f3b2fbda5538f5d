"""The slot task: the supervisor that restores a seed and runs the sandbox behind the
trust boundary. Ships in the container image (functions/seed_task/Dockerfile), never in
the Lambda layer."""
