"""A thin, synchronous Kafka client on semel's protocol layer.

Used by the CLI and by tests that need exact control (explicit producer id,
epoch and sequence; raw fetches). Applications use confluent-kafka.
"""
from .client import Client, ClientError  # noqa: F401
