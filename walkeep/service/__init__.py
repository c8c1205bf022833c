"""The service layer: Walkeep's operations, transport-free (DESIGN §1)."""
