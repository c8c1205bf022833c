"""What Walrus and Sui define, in one place: the encoded size and storage cost, the epoch
limit, the quilt layout and patch ids, BCS and base58.

Pure and transport-free. Adapters (``walkeep.backends``) and services both learn
protocol facts here, so no adapter has to import a business module to speak the wire
format; Walkeep's own rules (prices, lifecycle states, the ledger) stay out.
"""
