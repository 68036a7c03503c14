"""A generated movie knowledge base and its two tasks, in the form of bAbI Movie Dialog.

`generate(num_movies, num_users, seed)` makes, from `seed` alone:
- the knowledge base: movies with a director, one or two writers, two to four actors, a
  genre, a release year and one to three tags, as (subject, relation, object) triples
  (`Movie.triples`) and one short text document per movie (`Movie.document`):
      "dark_harbor directed_by mara_voss written_by ... starred_actors ... release_year 1994
       has_genre thriller has_tags heist revenge"
  Every entity is one token (names joined by '_'), so an answer is one word of the
  documents. People and tags lean to genres (a director mostly makes one genre, a genre has
  its own tags), so that tastes exist for the recommendations to learn.
- QA: factoid questions whose answers are read off the triples, several where the triples
  give several ("what films did ACTOR act in" -> every movie listing ACTOR), for each
  relation in both directions.
- Recs: users with a taste (a genre and one of its tags); each likes four movies, mostly of
  that taste, in order; the question names the first three ("i liked A , B and C . what
  else would i like"), the answer is the fourth (Movie Dialog's Recs task has one answer).

`prepare(config, workdir, verbose)` writes them into `<workdir>/data/` (`config.data.source
= 'movies'`, sizes and seed in `config.movies`), reusing what a previous run with the same
settings wrote:
  movies.kb.tsv                     the triples, `subject\\trelation\\tobject` a line
  movies.documents.txt              document i of the knowledge base on line i
  movies.{qa,recs}.{train,valid,test}.jsonl   {"question": text, "answers": [entity, ...]}
  vocab.json                        every word of the documents and questions (the words
                                    of the world the model reads, not of a split)
  movies.manifest.json              the settings that made them
The splits are a seeded 80/10/10 partition of each task's questions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Sequence

import ml_collections
import numpy as np

from mtn_jax import errors
from mtn_jax import files
from mtn_jax.data.vocab import SPECIAL_TOKENS
from mtn_jax.data.vocab import Vocab

TASKS = ('qa', 'recs')
SPLITS = ('train', 'valid', 'test')
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
RELATIONS = ('directed_by', 'written_by', 'starred_actors', 'release_year', 'has_genre',
             'has_tags')
# Bump when the files written here change meaning.
FORMAT = 1
_MANIFEST = 'movies.manifest.json'

GENRES = ('drama', 'comedy', 'thriller', 'horror', 'romance', 'western', 'animation',
          'documentary', 'war', 'crime', 'fantasy', 'musical')
_TAGS = ('heist', 'revenge', 'space', 'dragons', 'friendship', 'betrayal', 'prison', 'ghosts',
         'wedding', 'desert', 'sailing', 'robots', 'cowboys', 'zombies', 'jazz', 'boxing',
         'spies', 'pirates', 'vampires', 'trains', 'orphans', 'islands', 'kings', 'witches',
         'soldiers', 'detectives', 'dancers', 'chefs', 'aliens', 'monsters', 'lawyers',
         'teachers', 'twins', 'gangsters', 'survival', 'holidays', 'circus', 'mountains',
         'submarines', 'racing', 'painters', 'miners', 'nurses', 'outlaws', 'magicians',
         'farmers', 'sharks', 'floods')
_TAGS_PER_GENRE = 4
_SYLLABLES = ('ka', 'ri', 'mo', 'len', 'tor', 'vi', 'sa', 'del', 'ro', 'na', 'bel', 'quin',
              'mar', 'os', 'te', 'lu', 'far', 'ga', 'dor', 'pe', 'zan', 'li', 'cor', 'ma',
              'hal', 'ven', 'ti', 'wes', 'ber', 'du')
_TITLE_WORDS = ('dark', 'harbor', 'silent', 'river', 'last', 'summer', 'broken', 'crown',
                'golden', 'road', 'iron', 'heart', 'midnight', 'city', 'lost', 'garden',
                'red', 'moon', 'cold', 'fire', 'long', 'night', 'hidden', 'valley', 'wild',
                'storm', 'paper', 'bridge', 'glass', 'tower', 'black', 'sea', 'distant',
                'shore', 'secret', 'kingdom', 'empty', 'house', 'winter', 'song')
_PEOPLE_PER_MOVIE = {'directors': 6, 'writers': 5, 'actors': 2}  # movies per person, about
_YEARS = (1960, 2016)


@dataclasses.dataclass(frozen=True)
class Movie:
  title: str
  director: str
  writers: tuple[str, ...]
  actors: tuple[str, ...]
  genre: str
  year: int
  tags: tuple[str, ...]

  def objects(self) -> dict[str, tuple[str, ...]]:
    """Relation -> its objects, in `RELATIONS` order."""
    return {'directed_by': (self.director,), 'written_by': self.writers,
            'starred_actors': self.actors, 'release_year': (str(self.year),),
            'has_genre': (self.genre,), 'has_tags': self.tags}

  def triples(self) -> list[tuple[str, str, str]]:
    return [(self.title, r, o) for r, objects in self.objects().items() for o in objects]

  def document(self) -> str:
    """The movie as one short text: its title, then each relation and its objects."""
    return ' '.join([self.title] + [w for r, objects in self.objects().items()
                                    for w in (r, *objects)])


@dataclasses.dataclass(frozen=True)
class Question:
  task: str  # 'qa' or 'recs'
  text: str
  answers: tuple[str, ...]

  def to_json(self) -> dict:
    return {'question': self.text, 'answers': list(self.answers)}


@dataclasses.dataclass(frozen=True)
class MovieWorld:
  movies: tuple[Movie, ...]
  questions: dict[str, tuple[Question, ...]]  # task -> questions, before splitting

  def triples(self) -> list[tuple[str, str, str]]:
    return [t for m in self.movies for t in m.triples()]

  def documents(self) -> list[str]:
    return [m.document() for m in self.movies]


def _names(rng: np.random.Generator, count: int, parts: int, taken: set[str]) -> list[str]:
  """`count` new one-token names of `parts` invented words ('mara_voss'), none in `taken`."""
  names = []
  while len(names) < count:
    words = [''.join(rng.choice(_SYLLABLES, size=rng.integers(2, 4))) for _ in range(parts)]
    name = '_'.join(words)
    if name not in taken:
      taken.add(name)
      names.append(name)
  return names


def _titles(rng: np.random.Generator, count: int, taken: set[str]) -> list[str]:
  titles = []
  while len(titles) < count:
    words = rng.choice(_TITLE_WORDS, size=rng.integers(2, 4), replace=False)
    title = '_'.join(words)
    if title in taken:  # a sequel keeps the name apart
      title = f'{title}_{rng.integers(2, 9)}'
    if title not in taken:
      taken.add(title)
      titles.append(title)
  return titles


def _people(rng: np.random.Generator, kind: str, num_movies: int,
            taken: set[str]) -> tuple[list[str], np.ndarray]:
  """Names of one kind of people and the genre each leans to."""
  names = _names(rng, max(len(GENRES), num_movies // _PEOPLE_PER_MOVIE[kind]), 2, taken)
  return names, rng.integers(0, len(GENRES), size=len(names))


def _pick(rng: np.random.Generator, people: list[str], leaning: np.ndarray, genre: int,
          count: int, lean: float) -> tuple[str, ...]:
  """`count` distinct people, each from those leaning to `genre` with probability `lean`."""
  chosen: list[str] = []
  leaning_to = np.flatnonzero(leaning == genre)
  while len(chosen) < count:
    pool = leaning_to if (rng.random() < lean and len(leaning_to)) else np.arange(len(people))
    person = people[int(rng.choice(pool))]
    if person not in chosen:
      chosen.append(person)
  return tuple(chosen)


def generate_movies(num_movies: int, rng: np.random.Generator) -> tuple[Movie, ...]:
  taken: set[str] = set(GENRES) | set(_TAGS) | set(RELATIONS)
  titles = _titles(rng, num_movies, taken)
  directors, director_genres = _people(rng, 'directors', num_movies, taken)
  writers, writer_genres = _people(rng, 'writers', num_movies, taken)
  actors, actor_genres = _people(rng, 'actors', num_movies, taken)
  genre_tags = np.asarray(_TAGS[:len(GENRES) * _TAGS_PER_GENRE]).reshape(len(GENRES), -1)
  movies = []
  for title in titles:
    genre = int(rng.integers(len(GENRES)))
    tags = rng.choice(genre_tags[genre], size=rng.integers(1, 4), replace=False)
    movies.append(Movie(
        title=title,
        director=_pick(rng, directors, director_genres, genre, 1, 0.8)[0],
        writers=_pick(rng, writers, writer_genres, genre, int(rng.integers(1, 3)), 0.7),
        actors=_pick(rng, actors, actor_genres, genre, int(rng.integers(2, 5)), 0.6),
        genre=GENRES[genre], year=int(rng.integers(*_YEARS)), tags=tuple(sorted(tags))))
  return tuple(movies)


# Question templates: (relation, direction, text). 'forward': about a movie, the answers are
# the relation's objects; 'inverse': about an object, the answers are the movies that list it.
_QA_TEMPLATES = (
    ('directed_by', 'forward', 'who directed {}'),
    ('directed_by', 'inverse', 'what movies did {} direct'),
    ('written_by', 'forward', 'who wrote {}'),
    ('written_by', 'inverse', 'what films did {} write'),
    ('starred_actors', 'forward', 'who acted in {}'),
    ('starred_actors', 'inverse', 'what does {} act in'),
    ('release_year', 'forward', 'when was {} released'),
    ('has_genre', 'forward', 'what genre is {}'),
    ('has_tags', 'forward', 'what is {} about'),
)


def qa_questions(movies: Sequence[Movie], rng: np.random.Generator) -> tuple[Question, ...]:
  """One question per movie and forward template, and one per person and inverse template;
  the answers are exactly what the triples say, in the knowledge base's order."""
  by_object: dict[tuple[str, str], list[str]] = {}
  for movie in movies:
    for subject, relation, obj in movie.triples():
      by_object.setdefault((relation, obj), []).append(subject)
  questions = []
  for relation, direction, text in _QA_TEMPLATES:
    if direction == 'forward':
      questions += [Question('qa', text.format(m.title), m.objects()[relation])
                    for m in movies]
    else:
      questions += [Question('qa', text.format(obj), tuple(subjects))
                    for (r, obj), subjects in by_object.items() if r == relation]
  order = rng.permutation(len(questions))
  return tuple(questions[i] for i in order)


_LIKED = 4  # movies a user likes: three in the question, the answer


def recs_questions(movies: Sequence[Movie], num_users: int,
                   rng: np.random.Generator) -> tuple[Question, ...]:
  """One question per user: three liked movies named, the fourth to find. A user's taste is
  a genre and one of its tags; each liked movie has that taste with probability 0.8, the
  genre alone otherwise. Only genres of at least four movies are drawn; a world with none is
  refused."""
  genre_of = np.asarray([GENRES.index(m.genre) for m in movies])
  if num_users > 0 and np.bincount(genre_of).max() < _LIKED:
    # No user could like four movies of one genre: the loop below would never end.
    raise errors.ConfigError(
        f'config.movies.num_movies ({len(movies)}) gives no genre the {_LIKED} movies a '
        'recommendation question names: ask for more movies')
  questions = []
  while len(questions) < num_users:
    movie = movies[int(rng.integers(len(movies)))]
    genre, tag = movie.genre, movie.tags[int(rng.integers(len(movie.tags)))]
    of_taste = [i for i, m in enumerate(movies) if m.genre == genre and tag in m.tags]
    of_genre = np.flatnonzero(genre_of == GENRES.index(genre)).tolist()
    if len(of_genre) < _LIKED:
      continue
    liked: list[int] = []
    while len(liked) < _LIKED:
      pool = of_taste if (rng.random() < 0.8 and len(set(of_taste) - set(liked))) else of_genre
      pick = int(rng.choice(pool))
      if pick not in liked:
        liked.append(pick)
    titles = [movies[i].title for i in liked]
    questions.append(Question('recs', f'i liked {titles[0]} , {titles[1]} and {titles[2]} . '
                              'what else would i like', (titles[3],)))
  return tuple(questions)


def generate(num_movies: int, num_users: int, seed: int) -> MovieWorld:
  """The knowledge base and both tasks' questions; the same arguments give the same world."""
  if num_movies < len(GENRES):
    raise errors.ConfigError(f'config.movies.num_movies must be at least {len(GENRES)} '
                             f'(one per genre), got {num_movies}')
  kb_rng, qa_rng, recs_rng = (np.random.default_rng(s)
                              for s in np.random.SeedSequence(seed).spawn(3))
  movies = generate_movies(num_movies, kb_rng)
  return MovieWorld(movies, {'qa': qa_questions(movies, qa_rng),
                             'recs': recs_questions(movies, num_users, recs_rng)})


def split_questions(questions: Sequence[Question], seed: int) -> dict[str, list[Question]]:
  """A seeded partition into `SPLITS` by `SPLIT_FRACTIONS`."""
  order = np.random.default_rng(seed).permutation(len(questions))
  ends = np.round(np.cumsum(SPLIT_FRACTIONS) * len(questions)).astype(int)
  parts = np.split(order, ends[:-1])
  return {name: [questions[i] for i in np.sort(part)] for name, part in zip(SPLITS, parts)}


def vocabulary(texts: Iterable[str]) -> Vocab:
  """Every word of `texts`, most frequent first (the knowledge base is the model's world:
  all of its words are known)."""
  counts: dict[str, int] = {}
  for text in texts:
    for word in text.split():
      counts[word] = counts.get(word, 0) + 1
  return Vocab.from_counts(counts, min_count=1)


# ---------------------------------------------------------------------------------------------
# Files in the workdir


def paths(data_dir: str) -> dict[str, str]:
  names = {'kb': 'movies.kb.tsv', 'documents': 'movies.documents.txt', 'vocab': 'vocab.json',
           'manifest': _MANIFEST}
  names.update({f'{task}.{split}': f'movies.{task}.{split}.jsonl'
                for task in TASKS for split in SPLITS})
  return {k: os.path.join(data_dir, v) for k, v in names.items()}


def _manifest(settings: ml_collections.ConfigDict) -> dict:
  manifest = {'format': FORMAT, 'num_movies': int(settings.num_movies),
              'num_users': int(settings.num_users), 'seed': int(settings.seed)}
  manifest['fingerprint'] = hashlib.sha256(
      json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
  return manifest


def prepare(config: ml_collections.ConfigDict, workdir: str, verbose: bool = False) -> dict:
  """Writes the world of `config.movies` into `<workdir>/data/` (see the module
  docstring), or reuses it; returns the manifest with each task's split sizes. The manifest
  is removed first and written last: a build cut short leaves none, so it is built again."""
  settings = config.movies
  data_dir = os.path.join(os.path.abspath(workdir), 'data')
  where = paths(data_dir)
  manifest = _manifest(settings)
  try:
    with open(where['manifest'], encoding='utf-8') as f:
      current = json.load(f).get('fingerprint') == manifest['fingerprint']
  except (OSError, ValueError):
    current = False
  if current and all(os.path.exists(p) for p in where.values()):
    if verbose:
      print(f'Reusing the movie knowledge base in {data_dir}: same config.movies.')
    with open(where['manifest'], encoding='utf-8') as f:
      return json.load(f)
  world = generate(settings.num_movies, settings.num_users, settings.seed)
  os.makedirs(data_dir, exist_ok=True)
  if os.path.exists(where['manifest']):
    os.remove(where['manifest'])
  files.write_text(where['kb'], ''.join('\t'.join(t) + '\n' for t in world.triples()))
  documents = world.documents()
  files.write_text(where['documents'], ''.join(d + '\n' for d in documents))
  texts = list(documents)
  for task in TASKS:
    for split, questions in split_questions(world.questions[task], settings.seed).items():
      files.write_text(where[f'{task}.{split}'], ''.join(
          json.dumps(q.to_json()) + '\n' for q in questions))
      manifest[f'{task}.{split}'] = len(questions)
      texts += [q.text for q in questions]
  vocab = vocabulary(texts)
  files.write_text(where['vocab'], json.dumps(vocab.to_json()))
  manifest['vocab_size'] = len(vocab)
  files.write_text(where['manifest'], json.dumps(manifest, indent=2, sort_keys=True))
  if verbose:
    print(f'Wrote a knowledge base of {len(documents):,} movies ({len(world.triples()):,} '
          f'triples) and its questions to {data_dir}: '
          + '; '.join(f'{t}: ' + ' / '.join(f'{manifest[f"{t}.{s}"]:,}' for s in SPLITS)
                      for t in TASKS) + ' (train / valid / test).')
  return manifest


def load_documents(data_dir: str) -> list[str]:
  with open(paths(data_dir)['documents'], encoding='utf-8') as f:
    return f.read().splitlines()


def load_questions(data_dir: str, task: str, split: str) -> list[Question]:
  """One split of a task's questions; a malformed line is an error naming file and line."""
  path = paths(data_dir)[f'{task}.{split}']
  questions = []
  with open(path, encoding='utf-8') as f:
    for number, line in enumerate(f, 1):
      try:
        value = json.loads(line)
        questions.append(Question(task, value['question'], tuple(value['answers'])))
      except (ValueError, KeyError, TypeError) as e:
        raise errors.Error(f'{path}:{number}: not a question line '
                           '({"question": ..., "answers": [...]}): ' + str(e)) from None
  return questions


def answer_entities(documents: Sequence[str]) -> list[str]:
  """The candidate answers: every entity of the knowledge base (each document's words but
  the relation names), in order of first appearance."""
  skip = set(RELATIONS) | set(SPECIAL_TOKENS)
  return list(dict.fromkeys(w for d in documents for w in d.split() if w not in skip))
