"""Security: SASL authentication (sasl.py), the SCRAM user store (users.py) and
Kafka's ACL model with its authorizer (acl.py). Handlers ask one question:

    ctx.authorize(operation, resource_type, name) -> bool

(semel.broker.router.RequestContext.authorize), which counts and logs denials.
"""
