"""Message schemas (Kafka's JSON schema format) for APIs the codec lacks.

Each file states the fields of one message as Kafka's protocol defines them
(names, types, versions); kafka-python's schema loader reads them, so these
messages decode and encode exactly like the codec's own."""
