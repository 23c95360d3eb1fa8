"""Message schemas (Kafka's JSON schema format) for APIs the codec lacks.

Each file states the fields of one message as Kafka's protocol defines them
(names, types, versions); kafka-python's schema loader reads them, so these
messages decode and encode exactly like the codec's own.

One addition of semel's own: DescribeShareGroupOffsetsResponse's partitions carry three
tagged fields (tags 10000-10002: InFlight, Acquired, Archived), the share-partition's
window by record state, for semel's tools. Tagged fields are optional by design: a
client that does not know them skips them, and they are left out when unknown (-1)."""
