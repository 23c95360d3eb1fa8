"""Security's stores and rules: SASL authentication (sasl.py), the SCRAM user store
(users.py), Kafka's ACL model with its authorizer (acl.py), and both stores in etcd
(cluster_store.py). What uses them for a request sits one floor up, beside the
router: the authorization gate (broker/auth_gate.py) and the check it and the
handlers call (broker/auth_check.py). Handlers ask one question:

    ctx.authorize(operation, resource_type, name) -> bool

(semel.broker.router.RequestContext.authorize), which counts and logs denials.
"""
