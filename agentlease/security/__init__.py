"""Security: payload encryption (the codec and its server), decision signatures, redaction, tool secrets,
and the proofs of lease progress (``docs/security.md``)."""
