"""Pure decisions and the values they decide on: no I/O, imports only pydantic."""
