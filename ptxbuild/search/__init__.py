"""The search over an op's config space, and the recordings its offline replay reads."""
