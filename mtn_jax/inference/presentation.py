"""What a person is shown of a ranked pool of suggestions (`presented`): queries that read
as queries, the session's own subject first.

A ranker orders candidates by how likely the logged next query is among them; a person also
reads everything else in the list. So what only the generator wrote is kept out unless it is
`well_formed` (the training log holds it, or every pair of its words, and its first and last
words can start and end a query: word salad such as "harry city potter" has pairs no query of
the log has), and the first places go to candidates about the session
(`subjects.about_session`: sharing a word with it, or the site of a short query of it:
"nhra.com" after "nhra"), so that head queries ("google") fill the list only after them, or
where the session gives nothing to go on (`config.suggest.session_first`, `unrelated_first`,
`attested_only`). What was tried on rated
candidates and blind panels: docs/notes/2026-11-27-learned-ranker.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mtn_jax.inference import popular
from mtn_jax.inference import sources
from mtn_jax.inference import subjects

# A word the log's queries use at least this often is known well enough to say whether it
# starts or ends queries: one that starts (ends) under this share of its uses is no query's
# first (last) word ("of", "to", "in": what a cut leaves dangling).
EDGE_MIN_USES = 20
EDGE_MIN_SHARE = 0.02


def well_formed(counts: popular.LogCounts, so_far: Sequence[str]) -> Callable[[str], bool]:
  """Whether a candidate reads as a query after the session `so_far`: the log holds it, or
  every pair of consecutive words occurs in the log's queries or the session's, and its first
  and last words can start and end a query (a word the log rarely uses passes: nothing says it
  cannot). The session's word pairs are read once, for all its candidates."""
  seen = {pair for q in so_far for pair in popular.word_bigrams(q)}

  def formed(text: str) -> bool:
    if counts.issued.get(text):
      return True
    words = text.split()
    if not words:
      return False
    if not all(counts.bigrams.get(pair) or pair in seen for pair in zip(words, words[1:])):
      return False
    for edge, word in ((('<s>', words[0]), words[0]), ((words[-1], '</s>'), words[-1])):
      uses = counts.bigram_starts.get(word, 0)
      if edge not in seen and uses >= EDGE_MIN_USES and (
          counts.bigrams.get(edge, 0) < EDGE_MIN_SHARE * uses):
        return False
    return True

  return formed


def typed_before(candidate: dict) -> bool:
  """Whether a candidate ({'sources': the sources proposing it}) is a query of the user's
  past."""
  return sources.reads_past(candidate['sources'])


def added_to(text: str, previous: str) -> bool:
  """Whether `text` is `previous` with words put before or after it ("mexican insurance" ->
  "mexican insurance for sale", "free mexican insurance")."""
  return text.startswith(previous + ' ') or text.endswith(' ' + previous)


def presented(ranked: Sequence[dict], so_far: Sequence[str], counts: popular.LogCounts, *,
              session_first: int, attested_only: bool, unrelated_first: int = 0
              ) -> list[dict]:
  """What is shown of `ranked` ({'query', 'sources': the sources proposing it, ...}, best
  first) after the session `so_far`.

  With `attested_only`, none that the generator alone wrote unless `well_formed` (the log's
  and the templates' candidates are queries or one edit of one); what the user typed before
  (a source that `proposes_past`) is a query. Then the first `session_first` places go to the
  best `well_formed` candidates (no word salad), at most `unrelated_first` of them not
  `subjects.about_session` (a head query such as "google", the user's habit query, a lone
  word of the session: each where the ranker puts it, first too), none the
  previous query with words added that neither the log nor the user's past holds (people
  rate most such additions odd: "mexican insurance for kids", "free the big guy"), none a
  query of the session (the user-facing protocol drops those, `pipeline.show`: the places
  stay with what it shows, as if they had never been candidates; the paper's protocol, which
  keeps them, shows them after the first places); where the session gives too few, the next
  well-formed ones in order fill the places. The rest follow in the ranker's order, what
  is not well-formed last (recall kept below what reads as a query)."""
  reads_as_query = well_formed(counts, so_far)
  # The user's own earlier queries were typed by a person: queries, whatever the log holds.
  formed = {c['query']: typed_before(c) or reads_as_query(c['query']) for c in ranked}
  if attested_only:
    ranked = [c for c in ranked if set(c['sources']) != {'generate'} or formed[c['query']]]
  if not session_first:
    return list(ranked)
  first, rest, malformed, unrelated = [], [], [], 0
  about = subjects.about_session(so_far)
  issued = set(so_far)
  for c in ranked:
    if not formed[c['query']]:
      malformed.append(c)
    elif len(first) == session_first or c['query'] in issued or (
        added_to(c['query'], so_far[-1]) and not counts.issued.get(c['query'])
        and not typed_before(c)):
      rest.append(c)
    elif about(c['query']):
      first.append(c)
    elif unrelated < unrelated_first:
      first.append(c)
      unrelated += 1
    else:
      rest.append(c)
  return first + rest + malformed
