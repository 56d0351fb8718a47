"""Laminar: a Kubernetes-native message queue on a partitioned, replicated commit log."""

__version__ = "0.1.0"
