"""Inference: a trained model loaded from its checkpoint (`trained`), and everything that turns
it into suggestions: the suggestion `pipeline`, the candidate `sources`, the learned ranker
(`learned`; its training, run by `--mode=train`: `learned_training`) and what is shown of its
order (`presentation`), the retriever, IMDNA's proposer, a user's habits, reading decode
input, and the decode and suggest modes. The names most callers need are re-exported here."""

from mtn_jax.inference.trained import load_trained
from mtn_jax.inference.trained import saved_model_config
from mtn_jax.inference.trained import Trained

__all__ = [
    'Trained',
    'load_trained',
    'saved_model_config',
]
