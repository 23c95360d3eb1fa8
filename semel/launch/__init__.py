"""Process launchers: a semel broker, the Tansu peer, etcd and a local cluster of
them, each started by its command line. `semel demo|check|bench|cluster`, the
benchmarks and the test-suite use them; nothing here imports the server side."""
