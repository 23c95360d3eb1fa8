"""`semel check`: an exactly-once anomaly checker for any Kafka-compatible broker.

Talks to brokers only over the wire (confluent-kafka), never through semel's
broker, storage or coordinator code.
"""
