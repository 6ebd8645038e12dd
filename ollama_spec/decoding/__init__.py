"""The draft/verify loop over plain arrays: verifiers, proposers, the K policy, sampling, penalties."""
