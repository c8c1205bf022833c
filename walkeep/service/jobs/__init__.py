"""Background work: completing accepted writes and compaction (the write pipeline),
renewal with pause, the sweep, reconciliation and the index backfill. Called by the
scheduler and the in-process completer, never by an agent."""
