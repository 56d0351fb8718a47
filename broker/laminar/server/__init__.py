"""The broker process: aiohttp HTTP API v1, request routing, peer transport, metrics."""
