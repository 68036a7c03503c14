"""mtn_jax: Multiresolution Transformer Networks for next-query suggestion, in JAX/Flax."""
