"""Exact values of the training losses on hand cases."""

import math

import jax.numpy as jnp
import numpy as np

from mtn_jax.losses import token_losses


def test_plain_cross_entropy():
  logits = jnp.array([[math.log(3.0), 0.0, -1e9, -1e9]])  # p = (3/4, 1/4, 0, 0)
  loss, nll = token_losses(logits, jnp.array([1]))
  np.testing.assert_allclose(nll, [math.log(4.0)], rtol=1e-6)
  np.testing.assert_allclose(loss, nll)


def test_label_smoothing_mixes_in_the_uniform_distribution():
  logits = jnp.zeros((1, 4))  # uniform: -log p = log 4 for every word
  loss, nll = token_losses(logits, jnp.array([2]), label_smoothing=0.1)
  np.testing.assert_allclose(loss, [math.log(4.0)], rtol=1e-6)
  logits = jnp.array([[math.log(3.0), 0.0, 0.0, 0.0]])  # p = (1/2, 1/6, 1/6, 1/6)
  loss, nll = token_losses(logits, jnp.array([0]), label_smoothing=0.2)
  expected = 0.8 * math.log(2.0) + 0.2 * (math.log(2.0) + 3 * math.log(6.0)) / 4
  np.testing.assert_allclose(loss, [expected], rtol=1e-6)
  np.testing.assert_allclose(nll, [math.log(2.0)], rtol=1e-6)


def test_entropy_regulariser_rewards_spread():
  logits = jnp.array([[math.log(3.0), 0.0, -1e9, -1e9]])  # p = (3/4, 1/4)
  entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
  loss, nll = token_losses(logits, jnp.array([0]), entropy_weight=0.1)
  np.testing.assert_allclose(loss, [math.log(4 / 3) - 0.1 * entropy], rtol=1e-5)
  np.testing.assert_allclose(nll, [math.log(4 / 3)], rtol=1e-5)
