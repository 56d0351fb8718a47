"""The broker's web console (docs/console.md): pages at `/` and `/console/...`, the OpenAPI
document at `/openapi.yaml` and `/openapi.json`, and an interactive API page."""

from .routes import PATHS, Console, is_console_route

__all__ = ["PATHS", "Console", "is_console_route"]
