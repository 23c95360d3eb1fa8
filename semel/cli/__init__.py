"""The `semel` command."""
