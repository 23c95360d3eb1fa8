"""Handler modules, one per API family. Importing this package registers them all."""
from importlib import import_module

_MODULES = ["api_versions", "metadata", "topics", "produce", "fetch", "groups", "consumer_groups", "share_groups", "share_offsets", "offsets", "txn", "txn_admin", "records_admin", "configs", "cluster", "offset_delete",
            "sasl", "acls", "user_scram", "reassign"]

for _name in _MODULES:
    import_module(f"{__name__}.{_name}")
