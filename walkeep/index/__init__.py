"""Walkeep's own semantic index: offline embeddings + vectors in the database.

``embedder`` turns text into vectors without torch or network; ``vectors``
stores them per (account, namespace, blob) and answers cosine top-k queries.
"""
