"""semel: exactly-once streaming over the Kafka wire protocol."""

__version__ = "0.1.0"
