"""The suggestion service (`--mode=serve`): the suggestion pipeline of a workdir behind HTTP.

  engine    the model side: the pipeline loaded and warmed up for every batch shape it will
            run, requests checked against what the model reads, batches run;
  batcher   concurrent requests coalesced into batches, run on worker threads;
  history   each user's earlier queries in SQLite, for the models that read them;
  monitoring  the Prometheus metrics and the count of programs JAX compiled;
  app       the FastAPI application: the API, the page at /, the errors;
  service   what ties them together: start-up, reload, draining, and uvicorn;
  prepare   the service's programs compiled when training ends.

It sits above `mtn_jax.inference` (it may import inference and below, never evaluation or the
entry points) and shows exactly what `--mode=decode` writes for the same session and settings.
"""
