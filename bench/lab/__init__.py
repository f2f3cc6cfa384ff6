"""bench's own shared modules: timing, worker processes, the contract suite run one spec at a
time, the forward benchmarks' models, and the forecast benchmarks' runs,
predictors, tables and scores (bench/README.md lists each module). Scripts import these and
the public library, never each other."""
