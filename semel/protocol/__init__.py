"""Sans-IO Kafka protocol: bytes in, request objects out; responses to bytes.

Nothing here touches sockets, files or asyncio, and nothing here imports any
other part of semel.
"""
from .kafka_package import defer_client

# Before any module here imports kafka-python's message classes (see kafka_package).
defer_client()
