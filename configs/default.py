"""The keys every run shares, with the paper's values where the paper gives one.

Config files start from `get_config(MODEL)` here and change what they need, so a key has one
name and one meaning everywhere. `config.model` holds what every model reads; each model
family's own keys are in configs/families.py and come with the model's name:
`--config=configs/default.py:mtn` is MTN with every default (given a log,
`--config.data.raw_files`, or the demo's, `--config.data.source=demo`).
`mtn_jax.config_lib.validate` checks values before any work starts.
"""

import ml_collections

from configs import families


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """The shared keys; with `variant` a model's name, that model and its family's keys."""
  if variant and variant not in families.FAMILIES:
    raise ValueError(f'configs/default.py: unknown variant {variant!r} (a model: '
                     + ', '.join(families.FAMILIES) + ')')
  c = ml_collections.ConfigDict()
  c.seed = 0  # data order, initialisation and dropout all derive from it

  c.data = ml_collections.ConfigDict()
  # 'aol': read `raw_files`; 'demo': first write the embedded demo log into the workdir;
  # 'movies': IMDNA's generated movie knowledge base (configs/imdna_movies.py).
  c.data.source = 'aol'
  c.data.raw_files = ''  # a glob, or comma-separated paths/globs; plain or .gz
  c.data.demo_users = 1500  # size of the generated demo log
  c.data.demo_seed = 0
  c.data.session_gap_minutes = 30.0  # a gap of >= this starts a new session (paper Sec. 5.1)
  c.data.max_query_words = 10
  # What a query longer than max_query_words does to its session:
  #   'drop_session': the whole session is discarded (counted in stats);
  #   'split_session': the session is cut at the long query, which is dropped;
  #   'truncate': the query is cut to its first max_query_words words.
  c.data.long_query = 'drop_session'
  c.data.min_session_queries = 3
  c.data.max_session_queries = 5
  # Train / valid / test, counted in sessions. Train must be above 0; preprocessing fails when
  # train, or a split given more than 0, comes out empty (a log too small to split).
  c.data.split_fractions = (0.95, 0.025, 0.025)
  # 'session': the paper's random split of sessions; 'user': all of a user's sessions in one
  # split (sizes still by sessions), to measure suggestions for users never seen in training;
  # 'time': valid and test get users' latest sessions (one each a user at most), so a user's
  # history is the past; per user, not one cut in time for everyone.
  c.data.split_by = 'session'
  c.data.split_seed = 0
  # split_by='user' only: train on this many of the training users (a seeded choice), the
  # validation and test users unchanged: a learning curve. 0: all of them.
  c.data.train_users = 0
  # M > 0: each session keeps its user's M most recent earlier queries as its history
  # (any split's, never a later one's), for personalisation.
  c.data.history_queries = 0
  c.data.min_word_count = 8  # vocabulary: training words seen at least this often
  # 'word': the paper's word vocabulary (min_word_count); 'sentencepiece': a subword model of
  # vocab_size pieces trained on the training split, each query written in at most
  # max_query_tokens pieces (cut beyond, counted; decode and serve read queries alike);
  # suggestions are detokenised, metrics stay on words. The <= max_query_words filter applies
  # either way.
  c.data.tokenizer = 'word'
  c.data.vocab_size = 4000  # sentencepiece's alone (the word vocabulary: min_word_count)
  c.data.max_query_tokens = 24
  c.data.strict = False  # True: stop at the first malformed line instead of skipping it

  c.input = ml_collections.ConfigDict()
  # Sessions per batch are chosen per bucket (number of queries) to fill this many query
  # slots (sessions x queries), rounded down to a multiple of the device count.
  c.input.train_queries_per_batch = 256
  c.input.eval_queries_per_batch = 512
  c.input.worker_count = 0  # grain worker processes (0: in the main process)
  c.input.prefetch_batches = 2  # batches put on the devices ahead of the step

  # What every model reads; a model's own keys come with its family (configs/families.py):
  # `--config=configs/default.py:NAME`, or a config file of the model.
  c.model = ml_collections.ConfigDict()
  c.model.name = ''  # see mtn_jax.models.REGISTRY; set by families.use
  c.model.emb_dim = 512  # word embedding size
  c.model.dropout = 0.1  # rounded to a multiple of 2**-16 (mtn_jax/models/dropout.py)
  # False: the encoder and the decoder each learn a word table, as the paper's model sizes
  # imply; True: one table serves both.
  c.model.share_embeddings = False
  c.model.tie_embeddings = False  # True: the output layer is the decoder's word table
  c.model.compute_dtype = 'float32'  # 'bfloat16': bf16 compute, fp32 params and loss
  c.model.max_session_queries = 16  # query-position table size (>= data.max_session_queries)

  c.train = ml_collections.ConfigDict()
  c.train.num_epochs = 5  # model selection = best validation loss within these epochs
  c.train.max_steps = 0  # > 0: stop after this many steps even mid-epoch
  c.train.schedule = 'transformer'  # 'transformer' (Vaswani warm-up) | 'constant'
  c.train.learning_rate = 1.0  # 'transformer': factor on d_model^-0.5 * min(...); else the rate
  c.train.warmup_steps = 4000  # 'transformer' only; 0 under 'constant', which reads none
  c.train.adam_b1 = 0.9  # the optimizer is Adam (optax.adam), with these settings
  c.train.adam_b2 = 0.98
  c.train.adam_eps = 1e-9
  c.train.label_smoothing = 0.05
  c.train.grad_clip_norm = 0.0  # 0: no clipping
  c.train.entropy_weight = 0.0  # M-NSRF's entropy regulariser on the output distribution
  # The loss projects decoder states to the vocabulary this many target slots at a time (per
  # device), skipping chunks of padding, so the [tokens, vocabulary] logits never exist whole.
  # 256 suits small models on a CPU (docs/PERFORMANCE.md); the paper-size configs use 2048.
  c.train.loss_chunk_tokens = 256
  # K > 0: train on the training sessions of the users outside fold `held_out_fold` of K
  # (`sessions.user_folds`, seeded by data.split_seed; the corpus and vocabulary stay the
  # whole split's), so the model's suggestions on the held-out fold are those for users it
  # never saw. Rankers learn from such cross-fitted suggestions (train.hypotheses_from).
  c.train.user_folds = 0
  c.train.held_out_fold = 0
  # Rankers: comma-separated workdirs of K generators trained with
  # train.user_folds=K, one per held-out fold; each context's candidates then include the
  # suggestions of the generator that never saw its user (valid: the first one's), decoded
  # with each generator's own config.decode and cached in its workdir
  # (mtn_jax/inference/hypothesis_decoding.py).
  c.train.hypotheses_from = ''
  c.train.log_every_steps = 100
  c.train.checkpoint_every_steps = 1000
  c.train.keep_checkpoints = 2  # the last N are kept, plus the best by validation loss

  c.decode = ml_collections.ConfigDict()
  # The beam searched (under 'learned' the plan's `generate:N`, and a trained ranker's own).
  c.decode.beam_size = 5
  c.decode.length_penalty = 0.6  # GNMT alpha: scores are log p / ((5 + len) / 6) ** alpha
  c.decode.max_len = 11  # words + </s> (subword pieces + </s>: >= data.max_query_tokens + 1)
  c.decode.top_k = 5  # suggestions per list (after a session's last query; a log's every query)
  # False: `<unk>` is never suggested (it tells a user nothing and never matches a logged
  # query, though on logs with many rare words it is often the likeliest token).
  c.decode.emit_unk = False
  # True: a suggestion never holds a word twice (queries almost never do; a copy mixture
  # otherwise loops on the word it copies). Word vocabularies only (it blocks tokens).
  c.decode.block_repeats = False
  # Minimum Bayes risk (mtn_jax/decoding/mbr.py): the lists reordered by expected BLEU
  # against their own candidates, comma-separated. 'beam': the generator's beam (every
  # strategy that reads it), 'beam+session' the same with the session's queries among the
  # candidates; 'ranker': the pooled candidates of suggest.strategy='rerank', under the
  # ranker's softmax. 'none': no list.
  c.decode.mbr = 'none'
  # True: never offer a query the session already holds (the user-facing protocol); False:
  # the paper's protocol (a session's query may come back). Unset: per mode, --mode=suggest
  # and --mode=serve user-facing, --mode=decode the paper's. Evaluation reports both
  # protocols side by side, whatever this says.
  c.decode.exclude_session_queries = ml_collections.config_dict.placeholder(bool)
  # Sessions decoded together: eval's and decode's batches, the learned ranker's candidates.
  c.decode.batch_sessions = 64
  c.decode.input = ''
  c.decode.output = ''
  c.decode.max_eval_sessions = 0  # > 0: evaluate on a prefix of the split only
  # 'valid': --mode=eval on the validation split (eval/valid_results.json), to tune decoding
  # without looking at the test split.
  c.decode.eval_split = 'test'

  # How eval, decode and suggest make suggestions: 'generate' (the workdir's model alone: a
  # generative model's beam, or a ranker's retrieved pool entries), 'retrieve' (the pool
  # entries the ranker of `ranker_workdir` retrieves), 'rerank' (the workdir's generative
  # beam, the `retrieved` best pool entries of the ranker of `retriever_workdir` and the
  # session's own queries, pooled, scored by the ranker of `ranker_workdir`, deduplicated;
  # the top_k best are kept; the rankers must share the workdir's vocabulary), 'blend' and
  # 'learned' (below).
  c.suggest = ml_collections.ConfigDict()
  c.suggest.strategy = 'generate'
  c.suggest.ranker_workdir = ''  # a trained Bi-, Poly- or Cross-encoder's workdir
  c.suggest.retriever_workdir = ''  # '': the ranker's own (a Bi- or Poly-encoder)
  c.suggest.retrieved = 10  # pool entries the retriever adds to the candidates (0: none)
  # 'rerank' only: a trained configs/imdna_aol.py run on the same sessions, whose
  # `imdna_proposed` best next queries (what followed in the most similar training sessions)
  # join the candidates.
  c.suggest.imdna_workdir = ''
  c.suggest.imdna_proposed = 10
  # 'rerank' only: what the training log says without a model (mtn_jax/inference/popular.py)
  # joins the candidates: the `popular` most popular next queries (MPC), and the
  # `cooccurring` queries that most often followed the previous query, then MPC. 0: none.
  c.suggest.popular = 0
  c.suggest.cooccurring = 0
  # 'blend': the generator's beam and the training log's lists by quotas, in order: the first
  # N of each SOURCE (generate: the beam; popular: the most popular next queries;
  # cooccurring: the queries that most often followed the previous one), then the rest of
  # each. A query of the session counts towards no quota (mtn_jax/inference/pipeline.py);
  # the quotas before `generate` leave the beam a place of config.decode.top_k's.
  c.suggest.blend = 'popular:2,generate:10'
  # 'learned': the sources pooled (SOURCE:N, the generator first: it scores every candidate;
  # mtn_jax/inference/sources.py) and ordered by gradient-boosted trees learned at
  # --mode=train from cross-fitted candidates: `ranker_folds` generators, each trained without
  # one fold of the training users (in <workdir>/folds/), `ranker_rounds` boosting rounds
  # (mtn_jax/inference/learned_training.py). A workdir without a ranker suggests by `blend`.
  # `history` is the user's own earlier queries: those of an AOL-format log given to decode, of the
  # user a request names to the service (its history store), of the corpus in eval; a
  # session without a user gets none, and the ranker learns from contexts of both kinds;
  # `history_about` is the same past's queries that share a word with the session.
  c.suggest.sources = ('generate:10,popular:10,cooccurring:10,templates:20,history:10,'
                       'history_about:10')
  c.suggest.ranker_folds = 2
  c.suggest.ranker_rounds = 150
  # 'learned': `attested_only` keeps out what the generator alone wrote unless well-formed
  # (the training log holds it, or its word pairs: no word salad); `session_first` > 0 gives
  # the first places to the best well-formed candidates about the session and to at most
  # `unrelated_first` not about it (a head query such as "google", the user's habit query, a
  # lone word of the session); the rest follow in the ranker's order, what is not well-formed
  # last (mtn_jax/inference/presentation.py; docs/RESULTS.md).
  c.suggest.session_first = 5
  c.suggest.unrelated_first = 1
  c.suggest.attested_only = True
  # 'rerank': the user's habit query (the query of their past they issued most, the session's
  # queries left out) goes first where their past shows it right often enough: at least this
  # share of their past queries were the habit query of their moment, over at least
  # habit_min_past of them (mtn_jax/inference/habits.py). 0: never. What it gains, and the
  # setting chosen on the AOL sample's training users: docs/RESULTS.md, "A user's habits"; a
  # raw log given to decode is read with every earlier session of a user.
  c.suggest.habit_rate = 0.0
  c.suggest.habit_min_past = 5
  # The latest of a user's earlier queries that the sources of the past (`history`,
  # `history_about`) and the habit rule read, in evaluation, the ranker's training, decode of a
  # log and the service alike (its history store keeps at least as many): a heavy user's whole
  # past would make each suggestion cost as much as all their queries.
  c.suggest.past_queries = 1000
  # How a Bi-encoder retriever finds its best pool entries (decode, suggest and serve, by
  # 'generate', 'retrieve' or the retriever of 'rerank'): 'exact' scores the whole pool;
  # 'usearch' searches an approximate nearest-neighbour index of the cached candidate vectors
  # (mtn_jax/inference/retrieval.py), for pools too large to score exhaustively. A Poly- or
  # Cross-encoder's score is no inner product of fixed vectors: 'exact' only. Evaluation's
  # ranking stays exact either way.
  c.suggest.index = 'exact'

  # --mode=serve: an HTTP service of the workdir's best checkpoint (mtn_jax/serving/), with the
  # suggestions --mode=decode writes for the same session and protocol (config.decode and
  # config.suggest decide them; the service's protocol is the user-facing one unless
  # config.decode.exclude_session_queries=False). Batches are padded to a power of two below
  # max_batch or to max_batch, and their sessions likewise up to the model's
  # max_session_queries; each such shape is compiled once, at the start (warm_up_background
  # below says when the service listens; with 'rerank', a candidate list longer than any
  # before compiles once more).
  c.serve = ml_collections.ConfigDict()
  c.serve.host = '127.0.0.1'  # the address listened on ('0.0.0.0': every interface)
  c.serve.port = 8080  # 0: any free port (the one taken is printed)
  c.serve.max_batch = 8  # requests decoded together at most
  # Batches run at once, each on a thread of its own; 0: by the backend
  # (`service.default_workers`). On a CPU two: the model's compiled programs release Python's
  # lock, so a second batch runs on another core while the first does (it raises the
  # saturation on a 2-core CPU: docs/PERFORMANCE.md, "Serving"). On a GPU one: a batch's cost
  # there is the host's Python, which two batches only take turns at (a far longer tail).
  c.serve.workers = 0
  # How long the first request of a batch waits for others. 0: a batch starts as soon as a
  # worker is free, and the requests that come while it runs make the next one (batches
  # still grow with the load, and a lone request waits for nothing).
  c.serve.max_wait_ms = 0.0
  c.serve.queue_bound = 64  # requests waiting beyond this are refused: 503 with Retry-After
  c.serve.deadline_ms = 2000.0  # a request not answered in this time gets 504
  # SIGTERM: unready, new requests refused (503), those in flight answered, exit 0 within this.
  c.serve.drain_seconds = 10.0
  # Draining ends once no request came for this long: a load balancer that polls /readyz sends
  # requests until it sees the 503; those are answered 503 rather than reset.
  c.serve.drain_quiet_seconds = 0.5
  c.serve.max_body_bytes = 16384  # a larger request body is refused unread (413)
  # SQLite file (relative to the workdir) of each user's earlier queries, for what reads a
  # user's past (config.data.history_queries, the learned ranker's `history` sources, the
  # habit rule, a ranker that knows users); '': none kept.
  c.serve.history_db = 'serve/histories.sqlite'
  # A user's latest queries kept, the older deleted (at least config.suggest.past_queries where
  # the pipeline reads a user's past).
  c.serve.history_per_user = 1000
  # Folder (relative to the workdir) of XLA's compiled programs, kept across starts: a restart
  # or a reload of the same model is ready without compiling again, and a later eval, decode
  # or suggest run reads its own back; '': none kept. A cache set for the process
  # (JAX_COMPILATION_CACHE_DIR) is used instead.
  c.serve.compile_cache = 'serve/compile_cache'
  # True: the service listens once the shapes that hold any request are compiled (a lone
  # request and the largest batch, at the longest session); the others compile while it
  # serves, and until each has, its batches run padded to a compiled shape (the same
  # suggestions). False: it listens once every shape is compiled, on warm_up_threads threads
  # (0: one per core; XLA compiles without Python's lock, so the shapes' compilations
  # overlap); reloads and config.serve.prepare_after_train always compile every shape first.
  c.serve.warm_up_background = True
  c.serve.warm_up_threads = 0
  # After --mode=train (and all): the service's programs compiled into its compilation cache
  # (as a start of --mode=serve with this config would, in a process of its own), so that the
  # first start of the service reads them back instead of compiling them.
  c.serve.prepare_after_train = False
  # '': /admin/reload answers loopback clients only; else any client with this bearer token.
  c.serve.admin_token = ''

  c.report = ml_collections.ConfigDict()
  c.report.workdirs = ''  # comma-separated workdirs for --mode=report ('': the --workdir)
  c.report.output = ''  # default: <workdir>/report

  if not variant:
    return c
  families.use(c, variant)
  # What the shared keys' defaults must be for the model to train with every other default,
  # or for none to be set that it does not read:
  # the Transformer schedule scales the rate by d_model, which the recurrent, zero attention
  # and IMDNA models lack (Adam at a constant 1e-3, the paper's M-NSRF rate, instead); the
  # zero attention model reads each user's earlier queries.
  if 'd_model' not in c.model:
    constant_rate(c, 1e-3)
  # Label smoothing is a generator's (over the vocabulary): the rankers', the zero attention
  # and IMDNA models' losses are over candidates and read none.
  if variant not in families.GENERATORS:
    c.train.label_smoothing = 0.0
  if variant == 'zam':
    c.data.history_queries = 20
    c.model.dropout = 0.0  # the family has none
  return c


def constant_rate(c: ml_collections.ConfigDict, learning_rate: float) -> None:
  """Adam at a constant `learning_rate`: a schedule with no warm-up, so `warmup_steps` holds
  0 (config_lib refuses another value, which the schedule would not read)."""
  c.train.schedule, c.train.learning_rate, c.train.warmup_steps = 'constant', learning_rate, 0
