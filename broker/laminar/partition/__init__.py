"""Partition replicas: a Raft group plus its log, and how its membership follows placement."""
