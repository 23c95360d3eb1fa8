"""A logger for confluent-kafka (librdkafka) clients made by commands: their connection
chatter (a broker restarting, a metadata refresh) stays out of what a user reads."""
from __future__ import annotations

import logging


def quiet_logger(name: str = "semel.librdkafka") -> logging.Logger:
    logger = logging.getLogger(name)
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger
