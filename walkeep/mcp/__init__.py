"""The MCP entry points: Streamable HTTP (``server``, mounted by the web app), stdio (``stdio``)
and the stdio bridge to a hosted Walkeep (``bridge``)."""
