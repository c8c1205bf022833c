"""Walkeep's own recall index: offline embeddings and keyed term hashes, searched together.

``embedder`` turns text into vectors without torch or network; ``terms`` turns it into
keyed term hashes; ``rows`` keeps both per chunk in the database; ``segment`` and
``shard`` are the on-disk and in-process forms a query reads; ``search`` keeps them
fresh and bounded; ``ranking`` says how the two signals become one score.
"""
