"""Real semel brokers and clusters for a project's own tests: the pytest plugin
(semel.testing.pytest_plugin, found through the `pytest11` entry point once semel is
installed) and the handles it gives tests (Broker, Cluster, TopicFactory)."""
