"""The operator console: a web page over a cluster's brokers, topics, transactions,
consumer groups, Spark lag listener and `semel check` reports.

It reads the cluster only over the Kafka protocol (semel.client), so it works
against any Kafka-compatible cluster and shows more where a broker serves more
of the admin APIs. snapshot.py reads one view of the cluster, poller.py keeps
reading it and the recent history, actions.py holds the few writes, app.py is
the web application (Starlette) and its templates and static files ship in the
package.
"""
