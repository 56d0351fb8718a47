"""Transactions (docs/transactions.md): atomic writes across partitions."""
