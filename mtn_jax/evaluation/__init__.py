"""Evaluation: the test (or valid) split scored under both protocols beside the trivial
suggesters, the paper's metrics, the pool's ranking protocols, IMDNA's measures, and the report."""
