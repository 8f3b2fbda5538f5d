"""The world outside DynamoDB: R2, the slot runtime, AWS client configuration, time."""
