"""The replicated cluster (docs/cluster.md).

state.py      the view a broker has of the cluster: live brokers, per-partition
              replicas / leader / leader epoch / ISR, producer-id blocks; the
              contract between the control plane and the replication data plane.
etcd.py       (control plane) the consensus service: etcd over its v3 JSON gateway.
controller.py (control plane) the elected controller: assignments and leader election.
replica.py    (data plane) followers fetching from leaders, ISR, high watermark,
              acks=all; storage side in semel/storage/leader_epoch.py and log.py.
peer.py       (data plane) the asyncio connection a follower fetches over.
"""
