"""A generated search log in the AOL collection's format: the demo run's data.

`write_demo_log(path, num_users, seed)` writes, plain or gzip (by the `.gz` suffix), the header
`AnonID\\tQuery\\tQueryTime\\tItemRank\\tClickURL` and then one line per query event,
`user\\tquery\\tYYYY-MM-DD HH:MM:SS\\trank\\turl` (rank and url empty without a click), sorted by
user id then time, so that the AOL preprocessing reads it exactly like a real AOL file. The
same seed gives the same bytes, and the log of N users is the first N users of any larger log
with that seed (each user draws from their own `SeedSequence` child).

What it holds (the real log's quirks included):
- Users with 1 to 121 sessions (median 13) over March to May 2006, with lasting interests:
  each prefers 2-4 of the topic families below (and a home city), so topics recur.
- Sessions of 1 to 10 distinct queries. Gaps between a session's queries are seconds to
  minutes, a few just under 30 minutes; gaps between sessions are hours to days, a few just
  over 30 minutes and a few exactly 30:00, so the paper's 30-minute rule recovers every
  generated session exactly.
- Click lines: a clicked query's line carries rank and url, and further clicks repeat the
  query with their own rank and url right after it; some queries are re-submitted for the
  next result page. A few "-" queries and a few queries of more than 10 words.
- Structure a model can learn: most of a session follows from its first query. Each
  family has listed orders of entities and facets, a usual modifier and a habitual session
  script, which its sessions follow 60% of the time (any script otherwise):
  - refine: the family's refinement path, a function of the last query ("honda civic" ->
    "honda civic reviews" -> "used honda civic reviews" -> "used honda civic prices");
  - compare: the same query for the next two entities in the family's order, then back to
    the first query's entity under the next facet, and round again;
  - detour: the family's benchmark entity (its first), then the first query's entity under
    the next facet, alternating;
  - generic: a bare facet word ("reviews") answered by that facet for the first query's
    entity ("honda civic reviews"), facets in the family's order;
  - navigate: a site's name, then its one address ("delta" -> "www.delta.com"), then the
    entity's refinement path (banks, stores, portals) or the family's next site.
  A fifth of the planned queries are replaced by a random variant (another entity or facet,
  a modifier, or less), after which the session goes on with its plan. Opening queries
  often carry modifiers ("cheap", "in june") that stay with the session's later queries.
  A misspelt query is always followed by its correction, and 10% of the longer sessions
  switch task midway.
- 29 topic families of 12-16 entities each and about 1,500 distinct words (misspellings and
  addresses included): small enough for a small Transformer to learn on a CPU.

Size: the 1,500 users of configs/demo.py make a log of about a megabyte gzipped in a second
or two of CPU, of which the paper's preprocessing keeps some ten thousand sessions of 3 to 5
queries (Table-1 figures: `--mode=preprocess` prints them).
"""

from __future__ import annotations

import bisect
import dataclasses
import gzip
import io
import itertools
import math
import os
import re

import numpy as np

from mtn_jax import files

HEADER = 'AnonID\tQuery\tQueryTime\tItemRank\tClickURL'

_LOG_START = np.datetime64('2006-03-01T00:00:00', 's')
_LOG_SECONDS = 92 * 86400  # March 1 to May 31, like the AOL collection
_SESSION_GAP = 1800  # seconds: the paper's rule, >= 30 minutes starts a new session
_MAX_QUERY_WORDS = 10  # longer queries are only the deliberate over-long ones
_MAX_SESSION_QUERIES = 10

_CITIES = ('boston', 'new york', 'chicago', 'denver', 'miami', 'las vegas', 'orlando',
           'seattle', 'dallas', 'atlanta', 'phoenix', 'san diego', 'los angeles',
           'philadelphia', 'new orleans', 'nashville')
_STATES = ('florida', 'texas', 'california', 'ohio', 'michigan', 'georgia', 'new jersey',
           'pennsylvania', 'virginia', 'arizona', 'north carolina', 'illinois')


@dataclasses.dataclass(frozen=True)
class _Family:
  """A topic: sibling entities, facet templates (`{}` = the entity) and modifiers.

  `before` words specialise a query from the front ("cheap flights to boston"), `after`
  phrases from the back ("flights to boston in june"). `sites` are the family's web sites;
  with `entity_sites` every entity is a site as well (banks, stores, portals).
  """

  entities: tuple[str, ...]
  facets: tuple[str, ...]
  before: tuple[str, ...]
  after: tuple[str, ...]
  sites: tuple[str, ...] = ()
  entity_sites: bool = False
  popularity: float = 1.0

  @property
  def generic_facets(self) -> tuple[str, ...]:
    """Facets whose words make sense alone ("reviews" of "{} reviews")."""
    return tuple(f for f in self.facets if f.startswith('{} ') and len(f.split()) <= 3)


_FAMILIES: dict[str, _Family] = {
    'travel': _Family(
        _CITIES,
        ('flights to {}', 'hotels in {}', '{} vacation packages', '{} car rental',
         'things to do in {}'),
        ('cheap', 'discount', 'last minute'), ('in june', 'this weekend', 'for families'),
        ('expedia', 'orbitz', 'travelocity', 'priceline', 'southwest', 'delta')),
    'weather': _Family(
        _CITIES, ('{} weather', 'weather in {}', '{} forecast', '{} radar'),
        ('local', '10 day', 'extended'), ('tomorrow', 'this weekend'),
        ('weather', 'accuweather')),
    'real_estate': _Family(
        _CITIES,
        ('homes for sale in {}', '{} apartments for rent', '{} real estate', 'condos in {}'),
        ('cheap', 'new', 'luxury'), ('by owner', 'with pool'),
        ('realtor', 'craigslist', 'apartments')),
    'restaurants': _Family(
        _CITIES, ('restaurants in {}', '{} restaurants', '{} dining guide'),
        ('best', 'italian', 'mexican', 'chinese', 'seafood'), ('downtown', 'open late'),
        ('zagat', 'citysearch')),
    'places': _Family(
        _CITIES,
        ('map of {}', 'directions to {}', '{} zip codes', '{} area code', '{} airport'),
        ('driving', 'street', 'printable'), ('downtown', 'from chicago'),
        ('mapquest', 'google maps')),
    'jobs': _Family(
        ('nurse', 'teacher', 'truck driver', 'pharmacist', 'police officer',
         'dental assistant', 'medical assistant', 'paralegal', 'flight attendant',
         'firefighter', 'mechanic', 'bank teller', 'social worker', 'welder'),
        ('{} jobs', '{} salary', 'how to become a {}', '{} training', '{} resume'),
        ('part time', 'entry level', 'travel'), ('in texas', 'in ohio'),
        ('monster', 'careerbuilder', 'usajobs')),
    'cars': _Family(
        ('honda civic', 'honda accord', 'toyota camry', 'toyota corolla', 'ford mustang',
         'ford f150', 'chevy silverado', 'nissan altima', 'jeep wrangler', 'dodge ram',
         'mazda 3', 'hyundai sonata', 'chevy impala', 'vw jetta'),
        ('{} reviews', '{} prices', '{} for sale', '{} parts', '{} recalls', '{} mpg'),
        ('used', 'new', '2006', '2005'), ('under 10000', 'by owner'),
        ('kelley blue book', 'edmunds', 'autotrader', 'carmax', 'cars')),
    'sports': _Family(
        ('red sox', 'yankees', 'cubs', 'mets', 'braves', 'dallas cowboys',
         'pittsburgh steelers', 'new england patriots', 'chicago bears', 'green bay packers',
         'lakers', 'celtics', 'miami heat', 'detroit pistons'),
        ('{} tickets', '{} schedule', '{} scores', '{} roster', '{} news'),
        ('cheap', '2006', 'playoff'), ('today', 'home games'),
        ('espn', 'nfl', 'mlb', 'nba', 'stubhub')),
    'recipes': _Family(
        ('chicken', 'pork chops', 'meatloaf', 'lasagna', 'chili', 'banana bread',
         'cheesecake', 'pot roast', 'salmon', 'shrimp', 'beef stew', 'potato salad',
         'apple pie', 'chocolate chip cookies'),
        ('{} recipe', '{} recipes', 'how to cook {}', '{} calories'),
        ('easy', 'healthy', 'low carb', 'crock pot', 'baked', 'grilled'),
        ('for kids', 'from scratch'), ('allrecipes', 'food network', 'recipezaar')),
    'health': _Family(
        ('diabetes', 'high blood pressure', 'asthma', 'depression', 'migraine',
         'acid reflux', 'shingles', 'arthritis', 'lupus', 'strep throat', 'pneumonia',
         'bird flu', 'gout', 'thyroid'),
        ('{} symptoms', '{} treatment', '{} causes', 'what is {}', '{} diet'),
        ('early', 'natural', 'alternative'), ('in children', 'in women'),
        ('webmd', 'mayo clinic', 'medlineplus')),
    'movies': _Family(
        ('da vinci code', 'mission impossible 3', 'over the hedge', 'x men 3', 'poseidon',
         'ice age 2', 'cars', 'v for vendetta', 'scary movie 4', 'inside man',
         'failure to launch', 'the sentinel', 'silent hill', 'rv'),
        ('{} showtimes', '{} trailer', '{} cast', '{} reviews', '{} soundtrack'),
        ('official', 'new'), ('online', 'on dvd'), ('imdb', 'moviefone', 'fandango')),
    'music': _Family(
        ('kenny chesney', 'mariah carey', 'nickelback', 'shakira', 'usher',
         'carrie underwood', 'green day', 'rascal flatts', 'beyonce', 'eminem',
         'kelly clarkson', 'tim mcgraw', '50 cent', 'james blunt'),
        ('{} lyrics', '{} tickets', '{} tour dates', '{} songs', '{} pictures'),
        ('free', 'new'), ('2006', 'concert'), ('ticketmaster', 'mtv', 'limewire', 'itunes')),
    'tv': _Family(
        ('american idol', 'lost', 'desperate housewives', "grey's anatomy", 'the office',
         'prison break', 'days of our lives', 'the young and the restless', 'one tree hill',
         'house', 'survivor', 'deal or no deal', 'general hospital', '24'),
        ('{} spoilers', '{} episodes', '{} cast', '{} recap', '{} theme song'),
        ('new', 'last night'), ('season 2', 'finale'), ('tv guide', 'soapnet', 'abc', 'fox')),
    'celebrities': _Family(
        ('paris hilton', 'britney spears', 'angelina jolie', 'jessica simpson', 'tom cruise',
         'brad pitt', 'lindsay lohan', 'nicole richie', 'jennifer aniston', 'katie holmes',
         'oprah winfrey', 'anna nicole smith'),
        ('{} pictures', '{} news', '{} biography', '{} baby', '{} wallpaper'),
        ('new', 'latest'), ('2006', 'gossip'), ('people', 'tmz', 'eonline')),
    'electronics': _Family(
        ('ipod nano', 'ipod video', 'xbox 360', 'playstation 3', 'nintendo ds', 'psp',
         'digital camera', 'laptop', 'plasma tv', 'lcd tv', 'motorola razr', 'gps',
         'dvd player', 'mp3 player'),
        ('{} reviews', '{} prices', '{} deals', '{} accessories', '{} for sale'),
        ('cheap', 'best', 'refurbished', 'used'), ('on sale', 'under 200'),
        ('best buy', 'circuit city', 'amazon', 'newegg', 'cnet')),
    'stores': _Family(
        ('walmart', 'target', 'sears', "kohl's", 'jcpenney', 'home depot', "lowe's",
         "macy's", 'old navy', 'toys r us', 'bed bath and beyond', 'kmart', 'walgreens',
         'cvs'),
        ('{} coupons', '{} store locator', '{} hours', '{} weekly ad', '{} jobs',
         '{} credit card'),
        ('printable', 'online', 'local'), ('application', 'this week'),
        entity_sites=True),
    'banks': _Family(
        ('bank of america', 'wachovia', 'chase', 'wells fargo', 'washington mutual',
         'citibank', 'capital one', 'us bank', 'suntrust', 'national city', 'pnc',
         'regions'),
        ('{} online banking', '{} login', '{} locations', '{} mortgage rates',
         '{} credit card'),
        ('my', 'local'), ('customer service', 'phone number'), entity_sites=True),
    'portals': _Family(
        ('yahoo', 'google', 'myspace', 'ebay', 'hotmail', 'aol', 'msn', 'mapquest',
         'craigslist', 'youtube', 'amazon', 'wikipedia', 'pogo', 'ask jeeves'),
        ('{}', '{} login', '{} search', '{} help'),
        ('my', 'free'), ('sign in', 'home page'), entity_sites=True, popularity=4.0),
    'news': _Family(
        ('cnn', 'fox news', 'msnbc', 'abc news', 'cbs news', 'usa today', 'new york times',
         'washington post', 'drudge report', 'bbc news', 'yahoo news', 'nbc news'),
        ('{}', '{} headlines', '{} breaking news', '{} video'),
        ('latest', 'todays'), ('today', 'live'), entity_sites=True, popularity=1.5),
    'government': _Family(
        _STATES,
        ('{} dmv', '{} lottery', '{} unemployment', '{} state tax forms', '{} child support',
         '{} sex offender registry', '{} state parks'),
        ('official', 'free'), ('online', 'phone number'), ('irs', 'usps', 'ssa')),
    'colleges': _Family(
        ('ohio state', 'penn state', 'michigan state', 'ucla', 'texas a&m',
         'university of florida', 'notre dame', 'harvard', 'university of phoenix', 'devry',
         'georgia tech', 'boston college'),
        ('{} admissions', '{} tuition', '{} football', '{} application', '{} campus map'),
        ('online', 'graduate'), ('2006', 'requirements'),
        ('collegeboard', 'fafsa', 'princeton review')),
    'pets': _Family(
        ('golden retriever', 'labrador', 'german shepherd', 'pit bull', 'chihuahua', 'beagle',
         'poodle', 'dachshund', 'yorkie', 'boxer', 'shih tzu', 'siamese cat', 'persian cat',
         'maine coon'),
        ('{} puppies', '{} for sale', '{} training', '{} pictures', '{} rescue',
         '{} breeders'),
        ('miniature', 'free', 'teacup'), ('in ohio', 'for adoption'),
        ('petsmart', 'petco', 'akc')),
    'home': _Family(
        ('kitchen cabinets', 'hardwood floors', 'ceiling fans', 'bathroom vanity',
         'patio furniture', 'replacement windows', 'carpet', 'vinyl siding',
         'granite countertops', 'garage doors', 'water heater', 'deck'),
        ('{} prices', '{} installation', '{} ideas', 'how to install {}', '{} repair'),
        ('discount', 'cheap', 'used'), ('diy', 'cost'), ('home depot', "lowe's", 'sears')),
    'garden': _Family(
        ('roses', 'tomatoes', 'hydrangeas', 'tulips', 'azaleas', 'hostas', 'daylilies',
         'orchids', 'lavender', 'peonies', 'clematis', 'strawberries'),
        ('how to grow {}', 'planting {}', '{} care', '{} pictures', 'pruning {}'),
        ('organic', 'potted', 'climbing'), ('in containers', 'in shade'),
        ('burpee', 'gardenweb')),
    'games': _Family(
        ('poker', 'solitaire', 'mahjong', 'chess', 'bingo', 'sudoku', 'spades', 'hearts',
         'backgammon', 'checkers', 'crossword puzzles', 'pinball'),
        ('{} online', 'free {} games', 'play {}', '{} rules', '{} download'),
        ('free', 'online'), ('no download', 'for kids'), ('pogo', 'yahoo games', 'zone')),
    'software': _Family(
        ('itunes', 'limewire', 'aim', 'yahoo messenger', 'windows xp', 'internet explorer',
         'adobe reader', 'norton antivirus', 'spybot', 'firefox', 'winzip', 'real player',
         'quicktime', 'msn messenger'),
        ('{} download', '{} update', '{} help', 'uninstall {}', '{} problems'),
        ('free', 'latest'), ('for mac', 'for windows'), ('download', 'microsoft', 'cnet')),
    'parties': _Family(
        ('wedding', 'baby shower', 'birthday party', 'bridal shower', 'graduation party',
         'retirement party', 'anniversary', 'bachelorette party', 'halloween party',
         'christmas party', 'first birthday', 'sweet 16'),
        ('{} invitations', '{} ideas', '{} cakes', '{} decorations', '{} favors',
         '{} games'),
        ('cheap', 'unique', 'homemade'), ('for kids', 'on a budget'),
        ('the knot', 'party city', 'oriental trading')),
    'fashion': _Family(
        ('prom dresses', 'wedding dresses', 'jeans', 'handbags', 'sandals', 'swimsuits',
         'nike shoes', 'sunglasses', 'bridesmaid dresses', 'maternity clothes',
         'cowboy boots', 'coach purses'),
        ('{}', '{} sale', '{} online', '{} catalog', '{} outlet'),
        ('discount', 'cheap', 'plus size', 'designer'), ('2006', 'for women'),
        ("victoria's secret", 'nordstrom', "macy's")),
    'insurance': _Family(
        ('geico', 'state farm', 'allstate', 'progressive', 'nationwide', 'aflac',
         'blue cross blue shield', 'farmers', 'liberty mutual', 'usaa', 'metlife', 'humana'),
        ('{} car insurance', '{} quotes', '{} claims', '{} customer service', '{} agents'),
        ('cheap', 'online'), ('in florida', 'phone number'), entity_sites=True),
}
_FAMILY_NAMES = tuple(_FAMILIES)

# Sites whose address is not the name without spaces + ".com".
_SITE_DOMAINS = {
    'weather': 'weather.com', 'google maps': 'maps.google.com', 'usajobs': 'usajobs.gov',
    'kelley blue book': 'kbb.com', 'medlineplus': 'medlineplus.gov', 'irs': 'irs.gov',
    'ssa': 'ssa.gov', 'fafsa': 'fafsa.ed.gov', 'akc': 'akc.org', 'yahoo games':
    'games.yahoo.com', 'yahoo news': 'news.yahoo.com', 'wikipedia': 'wikipedia.org',
    'bbc news': 'news.bbc.co.uk', 'ask jeeves': 'ask.com', 'aim': 'aim.com',
    'washington mutual': 'wamu.com', 'bank of america': 'bankofamerica.com',
    'new york times': 'nytimes.com', 'usa today': 'usatoday.com',
}
# Domains that answer any kind of query, for clicks that are not on a topic's own site.
_GENERAL_DOMAINS = ('wikipedia.org', 'about.com', 'answers.com', 'geocities.com',
                    'tripod.com', 'citysearch.com', 'yellowpages.com', 'ebay.com')

# One frequent misspelling per word, as users make them, so that corrections recur often
# enough to be learnt (a misspelling seen once would only become <unk>).
_MISSPELLINGS = {
    'restaurants': 'restaraunts', 'recipes': 'recipies', 'recipe': 'recipie',
    'schedule': 'schedual', 'symptoms': 'symtoms', 'tickets': 'tickects',
    'apartments': 'appartments', 'weather': 'wheather', 'vacation': 'vaction',
    'cheap': 'cheep', 'hotels': 'hotles', 'lyrics': 'lyrcis', 'pictures': 'pictues',
    'accessories': 'accesories', 'philadelphia': 'philidelphia', 'diabetes': 'diabeties',
    'arthritis': 'arthritus', 'pneumonia': 'neumonia', 'florida': 'flordia',
    'california': 'califorina', 'pennsylvania': 'pensylvania', 'chihuahua': 'chiuahua',
    'dachshund': 'dashound', 'hydrangeas': 'hydrangias', 'cheesecake': 'cheescake',
    'lasagna': 'lasanga', 'shakira': 'shakria', 'nickelback': 'nickleback',
    'anatomy': 'anatomey', 'britney': 'brittany', 'citibank': 'citybank',
    'myspace': 'mysapce', 'craigslist': 'craiglist', 'hotmail': 'hotmial',
    'wikipedia': 'wikepedia', 'installation': 'instalation', 'camry': 'camery',
    'tomatoes': 'tomatos', 'solitaire': 'solitare', 'sudoku': 'suduko',
    'invitations': 'invitaions', 'decorations': 'decortions', 'bridesmaid': 'bridesmade',
    'maternity': 'maturnity', 'admissions': 'admisions', 'tuition': 'tution',
    'application': 'aplication', 'unemployment': 'unemployement', 'registry': 'registery',
    'attendant': 'attendent', 'pharmacist': 'pharmasist', 'mechanic': 'mecanic',
    'nintendo': 'nintedo', 'chesney': 'chesny', 'clarkson': 'clarkston',
    'trailer': 'trailor', 'episodes': 'episods', 'spoilers': 'spoliers', 'idol': 'idle',
    'desperate': 'desparate', 'housewives': 'housewifes', 'aniston': 'anniston',
    'forecast': 'forcast', 'vegas': 'vagas', 'phoenix': 'pheonix', 'seattle': 'seatle',
    'jewelry': 'jewelery', 'insurance': 'insurence', 'progressive': 'progresive',
    'mortgage': 'morgage', 'calories': 'calries',
    'sunglasses': 'sunglases', 'peonies': 'peonys', 'mahjong': 'majong',
}

# Sentences users paste or type instead of keywords: they wrap a query into > 10 words.
_LONG_QUERY_FORMS = (
    ('how do i find', 'for a family of four on a tight budget this year'),
    ('where can i find information about', 'that is reliable and easy to understand'),
    ('what is the best website to look for', 'if you live in a small town'),
    ('can anyone tell me where i can get', 'without paying too much money for it'),
)

# Facets that open with these words read wrongly behind a modifier ("cheap how to ...").
_CLAUSE_OPENERS = frozenset({'how', 'what', 'uninstall', 'play', 'planting', 'pruning'})

_WORD = re.compile(r'[a-z0-9]+')


def _word_count(query: str) -> int:
  """Words as the strictest cleaning sees them: punctuation splits ("www.delta.com" = 3)."""
  return len(_WORD.findall(query))


def _site_domain(site: str) -> str:
  return _SITE_DOMAINS.get(site, re.sub(r"[^a-z0-9]", '', site) + '.com')


def _cumulative(weights) -> tuple[float, ...]:
  return tuple(itertools.accumulate(weights))


class _Draws:
  """Random draws for one user, fetched from a numpy Generator in blocks.

  Hand-written because a scalar call into `np.random.Generator` costs about a microsecond
  and a 1,500-user log makes close to a million choices; drawing blocks keeps writing it to
  seconds while the sequence stays a pure function of the user's seed.
  """

  _BLOCK = 1024

  def __init__(self, generator: np.random.Generator):
    self._generator = generator
    self._uniforms: list[float] = []
    self._normals: list[float] = []

  def uniform(self) -> float:
    if not self._uniforms:
      self._uniforms = self._generator.random(self._BLOCK).tolist()
    return self._uniforms.pop()

  def normal(self) -> float:
    if not self._normals:
      self._normals = self._generator.standard_normal(self._BLOCK).tolist()
    return self._normals.pop()

  def chance(self, probability: float) -> bool:
    return self.uniform() < probability

  def below(self, n: int) -> int:
    return min(int(self.uniform() * n), n - 1)

  def between(self, low: int, high: int) -> int:
    """An integer in [low, high]."""
    return low + self.below(high - low + 1)

  def pick(self, options):
    return options[self.below(len(options))]

  def pick_weighted(self, options, cumulative: tuple[float, ...]):
    """One of `options`, chosen with the weights whose running sums are `cumulative`."""
    index = bisect.bisect_right(cumulative, self.uniform() * cumulative[-1])
    return options[min(index, len(options) - 1)]

  def lognormal(self, median: float, sigma: float) -> float:
    return median * math.exp(sigma * self.normal())


@dataclasses.dataclass(frozen=True)
class _Intent:
  """What a query asks: a modifier in front, the facet filled with the entity, one behind."""

  family: _Family
  entity: str
  facet: str
  before: str = ''
  after: str = ''

  @property
  def text(self) -> str:
    return ' '.join(p for p in (self.before, self.facet.format(self.entity), self.after) if p)


def _specialise(draws: _Draws, intent: _Intent) -> _Intent | None:
  """One of the family's modifiers added (one in front, one behind at most) where it fits."""
  options = []
  if not intent.before:
    options += [_with_modifier(intent, before=m) for m in intent.family.before]
  if not intent.after:
    options += [_with_modifier(intent, after=m) for m in intent.family.after]
  options = [o for o in options if o is not intent]
  return draws.pick(options) if options else None


def _generalise(intent: _Intent) -> _Intent | None:
  """Drops a modifier, else the facet (down to the bare entity)."""
  if intent.after:
    return dataclasses.replace(intent, after='')
  if intent.before:
    return dataclasses.replace(intent, before='')
  if intent.facet != '{}':
    return dataclasses.replace(intent, facet='{}')
  return None


def _facet_index(intent: _Intent) -> int:
  """The intent's place in its family's facet order; -1 for a facet outside it (bare)."""
  facets = intent.family.facets
  return facets.index(intent.facet) if intent.facet in facets else -1


def _fits(intent: _Intent) -> bool:
  """Whether the query reads right ("cheap how to ..." does not) within the word limit."""
  if intent.before and intent.facet.split()[0] in _CLAUSE_OPENERS:
    return False
  return _word_count(intent.text) <= _MAX_QUERY_WORDS


def _with_modifier(intent: _Intent, **modifier: str) -> _Intent:
  """The intent with a modifier (`before=` or `after=`) added where it fits and repeats no
  word of the query ("free free bingo games")."""
  modified = dataclasses.replace(intent, **modifier)
  new_words = set(' '.join(modifier.values()).split())
  if _fits(modified) and not new_words & set(intent.text.split()):
    return modified
  return intent


def _with_facet(intent: _Intent, facet: str) -> _Intent:
  """The intent under another facet, its modifiers kept where they still fit."""
  moved = dataclasses.replace(intent, facet=facet)
  return moved if _fits(moved) else dataclasses.replace(moved, before='', after='')


def _next_facet(intent: _Intent) -> _Intent:
  """The family's next facet in its listed order; the bare entity goes to the first one."""
  facets = intent.family.facets
  return _with_facet(intent, facets[(_facet_index(intent) + 1) % len(facets)])


def _shifted_entity(intent: _Intent, offset: int) -> _Intent:
  """The same query about the entity `offset` places on in the family's listed order."""
  entities = intent.family.entities
  return dataclasses.replace(
      intent, entity=entities[(entities.index(intent.entity) + offset) % len(entities)])


def _canonical_modifier(intent: _Intent) -> _Intent | None:
  """The intent with its family's usual modifier added: the first front one that fits, else
  the first back one ("honda civic prices" -> "used honda civic prices"); None if none fits."""
  for side, modifiers in (('before', intent.family.before), ('after', intent.family.after)):
    for modifier in modifiers:
      modified = _with_modifier(intent, **{side: modifier})
      if modified is not intent:
        return modified
  return None


def _refinement_step(intent: _Intent) -> _Intent:
  """One step along the family's refinement path, a function of the query alone.

  A bare entity gets the family's first facet, an unmodified facet the family's usual
  modifier, a modified query the next facet with its modifier kept, and a query modified on
  both sides loses the back modifier: "honda civic" -> "honda civic reviews" -> "used honda
  civic reviews" -> "used honda civic prices" -> "used honda civic for sale" -> ...
  """
  if intent.before and intent.after:
    return dataclasses.replace(intent, after='')
  if _facet_index(intent) >= 0 and not (intent.before or intent.after):
    return _canonical_modifier(intent) or _next_facet(intent)
  return _next_facet(intent)


def _random_sibling(draws: _Draws, intent: _Intent) -> _Intent:
  return dataclasses.replace(
      intent, entity=draws.pick([e for e in intent.family.entities if e != intent.entity]))


def _random_facet(draws: _Draws, intent: _Intent) -> _Intent:
  return _with_facet(intent, draws.pick([f for f in intent.family.facets if f != intent.facet]))


def _deviation(draws: _Draws, intent: _Intent) -> _Intent:
  """What a user asks instead of the planned query: another sibling or facet, a modifier of
  their own, or less; the planned query itself when the drawn move does not apply."""
  roll = draws.uniform()
  if roll < 0.3:
    candidate = _random_sibling(draws, intent)
  elif roll < 0.6:
    candidate = _random_facet(draws, intent)
  elif roll < 0.85:
    candidate = _specialise(draws, intent)
  else:
    candidate = _generalise(intent)
  return candidate or intent


def _misspell(draws: _Draws, query: str) -> str | None:
  """The query with one word misspelt, mostly the way most users misspell that word.

  A listed misspelling when the query has such a word; else two swapped letters, mostly in
  the middle of the word, so that each word's usual slip recurs often enough to be learnt.
  """
  words = query.split()
  known = [i for i, w in enumerate(words) if w in _MISSPELLINGS]
  if known:
    i = draws.pick(known)
    words[i] = _MISSPELLINGS[words[i]]
    return ' '.join(words)
  long_words = [i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha()]
  if not long_words:
    return None
  i = draws.pick(long_words)
  word = words[i]
  j = len(word) // 2 - 1 if draws.chance(0.7) else draws.between(1, len(word) - 3)
  if word[j] == word[j + 1]:
    return None
  words[i] = word[:j] + word[j + 1] + word[j] + word[j + 2:]
  return ' '.join(words)


def _site(draws: _Draws, intent: _Intent) -> str:
  """A site the intent's user may go to: the entity itself, or one of the family's sites."""
  family = intent.family
  return intent.entity if family.entity_sites else draws.pick(family.sites)


def _navigation_url(site: str) -> str:
  """The address users type for a site: "www.delta.com", or the host as it is where it has
  a name of its own ("maps.google.com")."""
  domain = _site_domain(site)
  return 'www.' + domain if domain.count('.') == 1 else domain


_POPULARITY_CUMULATIVE = _cumulative(f.popularity for f in _FAMILIES.values())
_OPENING_BEFORE_CHANCE = 0.4
_OPENING_AFTER_CHANCE = 0.3


@dataclasses.dataclass(frozen=True)
class _User:
  """Lasting interests: preferred families (weighted) and a favourite entity in each."""

  user_id: int
  families: tuple[str, ...]
  families_cumulative: tuple[float, ...]
  favourites: dict[str, str]

  def intent(self, draws: _Draws) -> _Intent:
    """A session's opening intent: mostly one of the user's interests and favourites."""
    if draws.chance(0.8):
      name = draws.pick_weighted(self.families, self.families_cumulative)
    else:
      name = draws.pick_weighted(_FAMILY_NAMES, _POPULARITY_CUMULATIVE)
    family = _FAMILIES[name]
    favourite = self.favourites.get(name)
    entity = favourite if favourite and draws.chance(0.5) else draws.pick(family.entities)
    opening = _Intent(family, entity, draws.pick(family.facets))
    # Modifiers asked for from the start stay with the session's queries where they fit.
    if draws.chance(_OPENING_BEFORE_CHANCE):
      opening = _with_modifier(opening, before=draws.pick(family.before))
    if draws.chance(_OPENING_AFTER_CHANCE):
      opening = _with_modifier(opening, after=draws.pick(family.after))
    return opening


def _new_user(draws: _Draws, user_id: int) -> _User:
  count = draws.between(2, 4)
  names: list[str] = []
  while len(names) < count:
    name = draws.pick_weighted(_FAMILY_NAMES, _POPULARITY_CUMULATIVE)
    if name not in names:
      names.append(name)
  home_city = draws.pick(_CITIES)
  favourites = {n: home_city if _FAMILIES[n].entities is _CITIES
                else draws.pick(_FAMILIES[n].entities) for n in names}
  # The first interest dominates, the others recur less often.
  return _User(user_id, tuple(names), _cumulative(1 / (rank + 1) for rank in range(count)),
               favourites)


# How often a user asks something else than the query their session's plan says next.
_DEVIATION_CHANCE = 0.2


def _asked(draws: _Draws, planned: _Intent) -> _Intent:
  """The planned query, or now and then a deviation from it."""
  return _deviation(draws, planned) if draws.chance(_DEVIATION_CHANCE) else planned


def _refine(draws: _Draws, intent: _Intent, length: int) -> list[str]:
  """Along the family's refinement path from the opening query; after a deviation the user
  goes on where the path was."""
  queries, planned = [intent.text], intent
  while len(queries) < length:
    planned = _refinement_step(planned)
    queries.append(_asked(draws, planned).text)
  return queries


def _compare(draws: _Draws, intent: _Intent, length: int) -> list[str]:
  """The opening query, then the same about the next two entities in the family's order;
  back to the first entity under the next facet, and round again."""
  queries, anchor = [intent.text], intent
  while len(queries) < length:
    step = len(queries) % 3
    if step == 0:
      anchor = _next_facet(anchor)
    queries.append(_asked(draws, _shifted_entity(anchor, step)).text)
  return queries


def _detour(draws: _Draws, intent: _Intent, length: int) -> list[str]:
  """Glances at the family's benchmark (its first entity, else its second), then returns to
  the first query's entity under the next facet: "toyota camry reviews" -> "honda civic
  reviews" -> "toyota camry prices" -> "honda civic prices" -> ..."""
  entities = intent.family.entities
  benchmark = entities[0] if intent.entity != entities[0] else entities[1]
  queries, anchor = [intent.text], intent
  while len(queries) < length:
    if len(queries) % 2:
      queries.append(_asked(draws, dataclasses.replace(anchor, entity=benchmark)).text)
    else:
      anchor = _next_facet(anchor)
      queries.append(_asked(draws, anchor).text)
  return queries


def _generic(draws: _Draws, intent: _Intent, length: int) -> list[str]:
  """A bare facet word ("reviews") answered by that facet for the first query's entity;
  the words follow the family's facet order from the first query's facet on."""
  facets = intent.family.generic_facets
  if not facets:
    return _refine(draws, intent, length)
  if intent.facet in facets and draws.chance(0.5):
    first = intent
  else:
    first = dataclasses.replace(intent, facet='{}')
  queries = [first.text]
  index = facets.index(first.facet) if first.facet in facets else -1
  while len(queries) < length:
    index = (index + 1) % len(facets)
    queries.append(facets[index][3:])
    queries.append(_asked(draws, dataclasses.replace(first, facet=facets[index])).text)
  return queries[:length]


def _navigate(draws: _Draws, intent: _Intent, length: int) -> list[str]:
  """From a site's name to its address; then along the refinement path when the site is the
  entity itself (banks, stores, portals), else on to the family's next site."""
  family = intent.family
  if family.entity_sites:
    queries = [intent.entity, _navigation_url(intent.entity)]
    planned = dataclasses.replace(intent, facet='{}', before='', after='')
    while len(queries) < length:
      planned = _refinement_step(planned)
      queries.append(_asked(draws, planned).text)
    return queries[:length]
  index = draws.below(len(family.sites))
  queries = []
  while len(queries) < length:
    site = family.sites[index % len(family.sites)]
    queries += [site, _navigation_url(site)]
    index += 1
  return queries[:length]


def _single(draws: _Draws, intent: _Intent) -> str:
  """A one-query session: often navigational, as in the real log."""
  roll = draws.uniform()
  if roll < 0.3:
    site = _site(draws, intent)
    return site if draws.chance(0.5) else _navigation_url(site)
  if roll < 0.45:
    return intent.entity
  refined = _specialise(draws, intent) if draws.chance(0.3) else None
  return (refined or intent).text


# Queries per session, 1..10: short sessions dominate, as in the real log.
_SESSION_LENGTH_CUMULATIVE = _cumulative(
    (0.26, 0.16, 0.16, 0.13, 0.1, 0.06, 0.05, 0.04, 0.02, 0.02))
_SCRIPTS = (_refine, _compare, _detour, _generic, _navigate)
_SCRIPT_CUMULATIVE = _cumulative((0.3, 0.2, 0.2, 0.2, 0.1))
# The script a family's sessions mostly follow (refine where none is named), so that the
# opening query already says much of where the session goes.
_HABITS = {_FAMILIES[name]: script for name, script in (
    ('weather', _compare), ('places', _detour), ('jobs', _compare), ('cars', _compare),
    ('sports', _detour), ('health', _generic), ('movies', _generic), ('music', _detour),
    ('tv', _generic), ('celebrities', _detour), ('electronics', _compare),
    ('stores', _navigate), ('banks', _navigate), ('portals', _navigate), ('news', _navigate),
    ('colleges', _compare), ('games', _detour), ('software', _generic),
    ('insurance', _compare))}
_HABIT_CHANCE = 0.6


def _session_queries(draws: _Draws, user: _User) -> tuple[list[str], tuple[str, ...]]:
  """1 to 10 queries, none equal to the one before it, and the sites their clicks go to."""
  length = 1 + draws.pick_weighted(range(_MAX_SESSION_QUERIES), _SESSION_LENGTH_CUMULATIVE)
  intent = user.intent(draws)
  sites = intent.family.sites + ((intent.entity,) if intent.family.entity_sites else ())
  if length == 1:
    return [_single(draws, intent)], sites
  with_typo = draws.chance(0.12)
  planned = length - with_typo
  if planned >= 4 and draws.chance(0.1):
    # A user who switches task mid-session: two unrelated intents.
    split = draws.between(2, planned - 2)
    queries = (_refine(draws, intent, split)
               + _refine(draws, user.intent(draws), planned - split))
  else:
    if draws.chance(_HABIT_CHANCE):
      script = _HABITS.get(intent.family, _refine)
    else:
      script = draws.pick_weighted(_SCRIPTS, _SCRIPT_CUMULATIVE)
    queries = script(draws, intent, planned)
  if with_typo:
    position = draws.below(len(queries))
    typo = _misspell(draws, queries[position])
    if typo is not None:
      queries.insert(position, typo)
  position = draws.below(len(queries))
  if draws.chance(0.003 * len(queries)) and '.' not in queries[position]:
    opening, closing = draws.pick(_LONG_QUERY_FORMS)
    queries[position] = f'{opening} {queries[position]} {closing}'
  return [q for i, q in enumerate(queries) if i == 0 or q != queries[i - 1]], sites


def _click_url(draws: _Draws, query: str, sites: tuple[str, ...]) -> str:
  """The clicked result's address: the site itself for an address query, else a topic site."""
  if query.startswith('www.') or query.endswith(('.com', '.gov', '.org', '.uk')):
    return 'http://' + ('www.' + query if query.count('.') == 1 else query)
  if sites and draws.chance(0.6):
    return 'http://www.' + _site_domain(draws.pick(sites))
  return 'http://www.' + draws.pick(_GENERAL_DOMAINS)


def _query_lines(draws: _Draws, query: str, time: int, room: int,
                 sites: tuple[str, ...]) -> list[tuple[str, int, str, str]]:
  """(query, second, rank, url) lines of one query issued at `time`, in time order.

  A click puts rank and url on the query's line; more clicks on the same result page
  repeat it with the same time; a re-submission (the next result page) comes a little
  later, and now and then a "-" line. Everything stays below `time + room`.
  """
  clicked = draws.chance(0.85 if '.' in query else 0.5)
  if not clicked:
    lines = [(query, time, '', '')]
  else:
    # Users click the top results most: rank 1 about half the time.
    rank = min(1 + int(-math.log(1 - draws.uniform()) * 1.5), 10)
    lines = [(query, time, str(rank), _click_url(draws, query, sites))]
    while rank < 10 and draws.chance(0.3):
      rank = min(rank + draws.between(1, 3), 10)
      lines.append((query, time, str(rank), _click_url(draws, query, sites)))
  if room > 2 and draws.chance(0.06):
    later = time + draws.between(1, min(60, room - 2))
    if draws.chance(0.4):
      lines.append((query, later, str(draws.between(11, 20)), _click_url(draws, query, sites)))
    else:
      lines.append((query, later, '', ''))
  if room > lines[-1][1] - time + 1 and draws.chance(0.01):
    lines.append(('-', draws.between(lines[-1][1], time + room - 1), '', ''))
  return lines


def _session_lines(draws: _Draws, queries: list[str], start: int,
                   sites: tuple[str, ...]) -> list[tuple[str, int, str, str]]:
  """(query, second, rank, url) lines of one session, in time order, from `start` on.

  Queries follow each other after seconds to minutes, now and then just under 30 minutes,
  and every extra line of a query (clicks, re-submissions, "-") comes before the next
  query: whether a sessionizer reads all lines or first drops "-" and repeats, no gap in
  the session reaches 30 minutes.
  """
  times = [start]
  for _ in queries[1:]:
    if draws.chance(0.03):
      gap = draws.between(25 * 60, _SESSION_GAP - 1)
    else:
      gap = int(min(max(draws.lognormal(50, 1.0), 4), 20 * 60))
    times.append(times[-1] + gap)
  lines = []
  for i, query in enumerate(queries):
    room = times[i + 1] - times[i] if i + 1 < len(times) else 120
    lines += _query_lines(draws, query, times[i], room, sites)
  return lines


def _user_lines(draws: _Draws, user: _User) -> list[tuple[str, int, str, str]]:
  """All of one user's lines, in time order; sessions start >= 30 minutes apart."""
  num_sessions = 1 + min(int(draws.lognormal(12, 0.8)), 120)
  # Busy users come back sooner, so that most fit the three months of the log.
  day_gap_median = min(max(0.6 * _LOG_SECONDS / num_sessions, 0.3 * 86400), 3 * 86400)
  gaps = []
  for _ in range(num_sessions - 1):
    roll = draws.uniform()
    if roll < 0.005:
      gaps.append(_SESSION_GAP)  # exactly 30:00, which the rule counts as a new session
    elif roll < 0.05:
      gaps.append(draws.between(_SESSION_GAP + 1, 40 * 60))
    elif roll < 0.35:
      gaps.append(int(min(max(draws.lognormal(3 * 3600, 0.8), 2700), 20 * 3600)))
    else:
      gaps.append(int(max(draws.lognormal(day_gap_median, 0.7), 20 * 3600)))
  span = sum(gaps) + num_sessions * _SESSION_GAP
  start = draws.below(max(_LOG_SECONDS - span, 1))
  lines = []
  for gap in gaps + [None]:
    queries, sites = _session_queries(draws, user)
    lines += _session_lines(draws, queries, start, sites)
    if gap is None:
      break
    start = lines[-1][1] + gap
    if start >= _LOG_SECONDS:
      break
  return lines


def _user_text(draws: _Draws, user: _User) -> str:
  lines = _user_lines(draws, user)
  seconds = np.array([line[1] for line in lines], dtype='timedelta64[s]')
  times = np.datetime_as_string(_LOG_START + seconds, unit='s')
  user_id = str(user.user_id)
  return ''.join(f'{user_id}\t{query}\t{time.replace("T", " ")}\t{rank}\t{url}\n'
                 for (query, _, rank, url), time in zip(lines, times))


def _write_users(stream: io.BufferedIOBase, user_seeds: list[np.random.SeedSequence]) -> None:
  stream.write((HEADER + '\n').encode())
  user_id = 0
  for user_seed in user_seeds:
    draws = _Draws(np.random.Generator(np.random.PCG64(user_seed)))
    # Ids increase with gaps, like the collection's, and each is drawn from its own user's
    # seed so that a smaller log is a prefix of a larger one.
    user_id += draws.between(1, 60)
    stream.write(_user_text(draws, _new_user(draws, user_id)).encode())


def write_demo_log(path: str | os.PathLike, num_users: int, seed: int) -> None:
  """Writes a `num_users`-user AOL-format log to `path` (gzip when it ends in `.gz`).

  The file appears complete or not at all (written aside, then renamed). The same
  (num_users, seed) gives the same bytes: randomness comes only from `seed`, and the gzip
  header carries no file name and a zero mtime.
  """
  path = os.fspath(path)
  if num_users < 1:
    raise ValueError(f'write_demo_log: num_users must be at least 1, got {num_users}')
  if seed < 0:
    raise ValueError(f'write_demo_log: seed must be non-negative, got {seed}')
  directory = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(directory):
    raise FileNotFoundError(f'write_demo_log: no directory {directory} to write {path} in')
  user_seeds = np.random.SeedSequence(seed).spawn(num_users)
  with files.atomic_open(path, 'wb') as raw:
    if path.endswith('.gz'):
      with gzip.GzipFile(filename='', mode='wb', fileobj=raw, mtime=0) as compressed:
        _write_users(compressed, user_seeds)
    else:
      _write_users(raw, user_seeds)
