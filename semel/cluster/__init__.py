"""The replicated cluster (docs/cluster.md).

state.py      the view a broker has of the cluster: live brokers, per-partition
              replicas / leader / leader epoch / ISR, producer-id blocks; the
              contract between the control plane and the replication data plane.
etcd.py       (control plane) the consensus service: etcd over its v3 JSON gateway.
controller.py (control plane) the elected controller: assignments and leader election.
replica_manager.py  (data plane) each partition's role, the leader's ISR, high
                    watermark and acks=all; storage side in semel/storage/
                    leader_epoch.py, replica_writes.py and log.py.
replica_fetcher.py  (data plane) followers fetching from leaders and truncating.
replica_rules.py    (data plane) the pure decisions both act on.
hw_checkpoint.py    (data plane) the saved high watermarks.
peer.py       (data plane) the asyncio connection a follower fetches over.
"""
