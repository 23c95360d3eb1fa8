"""Sans-IO Kafka protocol: bytes in, request objects out; responses to bytes.

Nothing here touches sockets, files or asyncio, and nothing here imports any
other part of semel.
"""
