"""The distributed core every capability shares: device meshes and the agreement checks run
before any collective, the collectives themselves (bounded by a timeout), the capture of a call
as an ATen graph, the cost records the planners price, the SPMD ops a sharded program runs, and
the paged KV cache that cache parallelism and the compile path's decode attention use.

Nothing here imports a capability (sharding, pipeline, cache_parallel, checkpoint, schedule)."""
