"""The broker: asyncio server, router, one handler module per API family."""
