"""Turning a model's scores into suggestions: beam search with a KV cache, and minimum-Bayes-risk
reranking."""
