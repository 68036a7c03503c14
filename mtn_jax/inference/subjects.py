"""What a query is about: its words, a site's name standing for its address, and whether a
candidate is about a session (`about_session`): the user's past queries about the session
(`sources.HistoryAbout`) and the first places of what is shown (`presentation.presented`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

_SITE = re.compile(r'^(?:www\.)?(.+?)(?:\.(?:com|org|net))?$')


def site_words(text: str) -> set[str]:
  """A query's words, a site's name standing for its address ("www.ebay.com" -> "ebay")."""
  return {_SITE.match(w).group(1) for w in text.split()}


# A session query of at most this many words written as a site ("bass champs" ->
# "basschamps.com") is about the session; a longer one joined is no address anyone types.
SITE_MAX_WORDS = 2


def about_session(so_far: Sequence[str]) -> Callable[[str], bool]:
  """Whether a candidate is about the session `so_far`: it shares a word with it (a site's
  name standing for its address), or is the address of a short query of it ("nhra" ->
  "nhra.com"), and is not one word of it alone (a lone word cut from what was typed says less
  than the query did). The session's words are read once, for all its candidates."""
  typed = {w for q in so_far for w in q.split()}
  session = set().union(*(site_words(q) for q in so_far))
  session |= {''.join(q.split()) for q in so_far if len(q.split()) <= SITE_MAX_WORDS}
  return lambda text: bool(site_words(text) & session) and not (
      len(text.split()) == 1 and text in typed)
