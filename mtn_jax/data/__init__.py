"""Data: query logs read and cut into sessions (`aol_log`), the corpus a workdir holds
(`preprocess` builds it; `sessions` reads it; `vocab`), the training batches (`input_pipeline`),
and what other models read: a ranker's pool of logged queries (`candidate_pool`), the generated
candidates a ranker learns from (`hypothesis_files`), IMDNA's documents (`imdna_library`,
`bm25`), copyable words outside the vocabulary (`extended`); `synthetic/` makes the demo logs.
Nothing here imports a model: the layers above read what this package writes."""
