"""Recoverability: the policy (immediate retries, delayed retries, the error queue), its step
of the chain, and the error queue with its tooling."""
