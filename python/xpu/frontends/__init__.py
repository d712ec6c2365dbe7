"""Frontends that import other frameworks' graphs as SGR-ML programs (docs/frontends.md)."""
