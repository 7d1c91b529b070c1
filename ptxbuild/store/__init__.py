"""The SQLite store: the cache of compiles, verdicts, timings and builds; lessons."""
