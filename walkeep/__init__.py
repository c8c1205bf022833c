"""Walkeep: durable, prepaid, auto-renewed memory for AI agents on Walrus."""

__version__ = "0.1.0"
