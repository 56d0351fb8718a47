"""The Laminar Kubernetes operator (kopf handlers arrive with the operator issue)."""
