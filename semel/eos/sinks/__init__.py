"""Two-phase-commit sinks, one module per external system.

Import the one you need; each pulls in only its own driver:

    semel.eos.sinks.memory      MemorySink          in-process (tests, models)
    semel.eos.sinks.filesystem  FileSystemSink      prepared/ -> committed/ rename
    semel.eos.sinks.http_echo   HttpEchoSink        on-commit callback gets the batch
    semel.eos.sinks.http        HttpSink            POST /prepare|/commit|/abort, GET /pending
    semel.eos.sinks.http_server ReferenceServer     the reference server for that protocol
    semel.eos.sinks.postgres    PostgresSink        PREPARE TRANSACTION, or a pending-flag table
    semel.eos.sinks.s3          S3Sink              __pending__/<txn>/ copied out on commit
    semel.eos.sinks.iceberg     IcebergSink         data files on prepare, snapshot on commit
    semel.eos.sinks.delta       DeltaSink           staged parquet, app-transaction commit
"""
