"""The keys of each model family under `config.model`, beside those every model holds
(configs/default.py), with the paper's values where the paper gives one.

A config file names its model with `use(c, NAME)` (or starts from
`default.get_config(NAME)`, `--config=configs/default.py:NAME` on the command line), which
gives `config.model` that model's keys and no other family's: a key under `config.model` is
a field of its model's config class (`mtn_jax.models.REGISTRY` pairs each name with its
class), one the model reads or, for the rankers' keys of the layers they share with MTN and
its decoder (`UNREAD_KEYS` in mtn_jax/models/polyencoder.py), one that must stay at its
default. A key every model holds that a model does not read (ZAM's `dropout`) must keep the
value that says so (its config class's `INERT_FIELDS`, in mtn_jax/models).
`--config.model.KEY=VALUE` for a key of another family fails naming the models that
read it, and `--config.model.name` changed on the command line fails naming a key the new
model lacks or does not read.
"""

from __future__ import annotations

import ml_collections


def transformer(m: ml_collections.ConfigDict) -> None:
  """The Transformer encoder-decoder's layers (mtn_jax/models/layers.py): the Transformer
  baseline's whole config, MTN's and the rankers' encoders."""
  m.d_model = 512  # emb_dim is projected to d_model where they differ
  m.num_heads = 8
  m.ff_dim = 1024
  m.query_layers = 3  # MTN's query encoder / the Transformer's encoder depth
  m.decoder_layers = 3
  m.pre_norm = False  # the paper is post-norm
  m.learned_positions = False  # sinusoidal position encodings, as in Vaswani et al.
  m.scan_layers = True  # nn.scan over layer stacks: flat compile time with depth
  # Under scan_layers, layers per iteration of the compiled loop: the stacks' depth unrolls it
  # (same parameters and random draws, one loop's overhead less; compile time grows with depth).
  m.scan_unroll = 1
  m.remat = 'none'  # 'none' | 'full' | 'dots': nn.remat policy inside the scan
  # A copy head mixes the session's words (those outside the vocabulary too) into the output
  # distribution (mtn_jax/models/copying.py).
  m.copy = False
  # A memory of the user's earlier queries (config.data.history_queries) as one more slot the
  # decoder attends to: 'none', 'attention' (AEM's eq. 9) or 'zero_attention' (ZAM's eq. 11,
  # which may attend to nothing), with its attention's hidden units
  # (mtn_jax/models/user_memory.py).
  m.user_memory = 'none'
  m.attention_hidden = 8
  # Kernel choices for a GPU, comma-separated, timed by launch/bench_kernels.py:
  # 'bf16_head_grads' (the output layer's gradient products in bfloat16; needs
  # compute_dtype='bfloat16'); '' runs XLA's own kernels (mtn_jax/models/layers.py, KERNELS).
  m.kernels = ''


def mtn(m: ml_collections.ConfigDict) -> None:
  """MTN (mtn_jax/models/mtn.py): the Transformer's layers and the session encoders."""
  transformer(m)
  m.session_layers = 2  # layers of each masked session encoder
  m.num_levels = 2  # K: a K-level MTN stacks K-1 masked session encoders


def ranker(m: ml_collections.ConfigDict) -> None:
  """Bi-, Poly- and Cross-encoders (mtn_jax/models/polyencoder.py), rankers of the training
  split's distinct queries: MTN's encoders (decoder_layers unused) and the rankers' own."""
  mtn(m)
  # The context encoder of the Bi- and Poly-encoders: 'flat' (the Transformer's, over
  # q_0 <sep> ... q_t) or 'mtn' (MTN's query and session encoders).
  m.context_encoder = 'flat'
  m.poly_codes = 16  # m, the Poly-encoder's learned codes (16, 64, 360 in the paper)
  m.cross_negatives = 15  # pool entries drawn per context to train the Cross-encoder
  # Bi- and Poly-encoders: pool entries drawn uniformly per batch as negatives of every
  # context, beside the batch's own next queries (mtn_jax/tasks/rankers.py).
  m.pool_negatives = 0
  # The session's queries so far are candidates too, and every candidate's target is graded
  # by its n-gram overlap with the true next query.
  m.session_candidates = False
  # Bi- and Poly-encoders: the K pool entries sharing the most words with each context's
  # session (BM25, its own queries left out) as its hard negatives.
  m.lexical_negatives = 0
  # Bi- and Poly-encoders: True divides the final score y_ctx . y_cand by sqrt(d_model), for
  # encoders trained from scratch (with the plain dot product the demo's tiny encoders
  # collapsed to one candidate vector); False is the paper's score.
  m.scaled_scores = False


def recurrent(m: ml_collections.ConfigDict) -> None:
  """Seq2Seq with attention, H-LSTM and M-NSRF (mtn_jax/models/recurrent.py)."""
  m.lstm_units = 256  # units per direction


def zam(m: ml_collections.ConfigDict) -> None:
  """The zero attention family (mtn_jax/models/zam.py), rankers of the training split's
  distinct queries."""
  # 'qem' (no user), 'hem' (a vector per user), 'aem' (attention over the user's earlier
  # queries) or 'zam' (the same with a zero vector).
  m.user_model = 'zam'
  m.attention_hidden = 8  # b, hidden units of the attention function f(q, i) (eq. 10)
  m.query_from = 'last'  # 'last': the latest query; 'session': every word so far
  m.item_negatives = 10  # k candidates sampled per context (eq. 14)
  m.word_negatives = 5  # k words sampled per word of a candidate (eq. 14)


def imdna(m: ml_collections.ConfigDict) -> None:
  """Iterative multi-document neural attention (mtn_jax/models/imdna.py); its task's
  settings are config.imdna (configs/imdna_movies.py)."""
  # GRU units per direction and inference state, inference steps T, the prediction network's
  # hidden units u (the slides name them without sizes: these are the project's choices).
  m.state_dim = 128
  m.inference_steps = 3
  m.hidden_units = 4096
  # 'attention' (the model) or 'embeddings' (the supervised-embedding baseline, which reads
  # no document).
  m.reader = 'attention'


# Each registered model's family (mtn_jax.models.REGISTRY has the same names).
FAMILIES = {
    'mtn': mtn, 'transformer': transformer,
    'seq2seq': recurrent, 'hred': recurrent, 'mnsrf': recurrent,
    'zam': zam,
    'biencoder': ranker, 'polyencoder': ranker, 'crossencoder': ranker,
    'imdna': imdna,
}


# The models that write suggestions word by word (`mtn_jax.tasks.Suggests`): their loss is over
# the vocabulary, and they alone read config.train.label_smoothing and loss_chunk_tokens.
GENERATORS = ('mtn', 'transformer', 'seq2seq', 'hred', 'mnsrf')


def keys(name: str) -> tuple[str, ...]:
  """The keys the family of model `name` adds to `config.model`."""
  m = ml_collections.ConfigDict()
  FAMILIES[name](m)
  return tuple(m.keys())


def families() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
  """{family function's name: (its models, its keys)}, in `FAMILIES`' order (`--help`)."""
  out: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
  for name, family in FAMILIES.items():
    models, family_keys = out.get(family.__name__, ((), keys(name)))
    out[family.__name__] = (models + (name,), family_keys)
  return out


def use(c: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  """`c` with model `name`: `config.model` keeps the keys every model reads (and their
  values) and gets the keys of `name`'s family at their defaults, no other's."""
  if name not in FAMILIES:
    raise ValueError(f'configs/families.py: unknown model {name!r} (known: '
                     + ', '.join(FAMILIES) + ')')
  shared = [k for k in c.model.keys() if k not in _ALL_FAMILY_KEYS]
  model = ml_collections.ConfigDict({k: c.model[k] for k in shared})
  model.name = name
  FAMILIES[name](model)
  c.model = model
  return c


_ALL_FAMILY_KEYS = frozenset(k for n in FAMILIES for k in keys(n))
