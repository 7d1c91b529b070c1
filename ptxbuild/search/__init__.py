"""The search over an op's config space, and its replay from a recording."""
