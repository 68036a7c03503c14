'use strict';
// Everything the server sends is shown with textContent: a suggestion is text, never HTML.
const session = [];
let maxQueries = 16;
let maxWords = 10;
let info = null;  // /v1/info, for the header
// Only the latest request's answer is shown: an earlier one that comes later (or one sent
// before "New session") would put back a session the user has moved on from.
let latest = 0;
let pending = null;  // the latest request's AbortController
const $ = (id) => document.getElementById(id);

function showModel(step) {
  if (!info) return;
  $('model').textContent = `${info.name}, checkpoint step ${step}; ${info.how}, ` +
      `best first (by ${info.score}); ` +
      (info.user_facing ? 'no query of the session is suggested again'
                        : "the paper's protocol (session queries may come back)");
  $('model').dataset.step = step;
}

// The JSON of an answer, or for one that is not JSON (a proxy's error page) its status line.
async function answerOf(response) {
  const type = response.headers.get('Content-Type') || '';
  if (type.includes('application/json')) return response.json();
  return {error: `${response.statusText || 'error'} (not a JSON answer)`};
}

function status(text, isError) {
  $('status').textContent = text;
  $('status').className = isError ? 'error' : '';
}

function showSession() {
  const list = $('session');
  list.replaceChildren();
  for (const query of session) {
    const item = document.createElement('li');
    item.textContent = query;
    list.appendChild(item);
  }
}

function showSuggestions(suggestions) {
  const list = $('suggestions');
  list.replaceChildren();
  // A hypothesis of no words (the model ended the query at once) is nothing to click.
  // Best first: the rank is shown, not the score (a log-probability, a ranker's score or a
  // blend's 1 / rank, comparable within one list only).
  for (const [i, s] of suggestions.filter((s) => s.query.trim()).entries()) {
    const item = document.createElement('li');
    const button = document.createElement('button');
    button.type = 'button';
    button.className = 'suggestion';
    const text = document.createElement('span');
    text.className = 'text';
    text.textContent = s.query;
    const rank = document.createElement('span');
    rank.className = 'rank';
    rank.textContent = `${i + 1}.`;
    button.title = `score ${Number(s.score).toFixed(3)}` +
      (s.model_score == null ? '' : `; model ${Number(s.model_score).toFixed(3)}`);
    button.append(rank, text);
    button.addEventListener('click', () => {
      submit(s.query);
      $('query').focus();  // the list is rebuilt: keep the keyboard where the next query goes
    });
    item.appendChild(button);
    list.appendChild(item);
  }
}

async function submit(query) {
  query = query.trim();
  if (!query) return;
  const typed = query;
  // The model reads a query's first maxWords words (as --mode=suggest cuts a typed one); a
  // longer one, typed or suggested, is sent cut.
  const words = query.split(/\s+/);
  const cut = words.length > maxWords;
  if (cut) query = words.slice(0, maxWords).join(' ');
  session.push(query);
  const dropped = session.length > maxQueries ? session.splice(0, session.length - maxQueries) : [];
  showSession();
  $('query').value = '';
  status('…', false);
  const body = {session: session.slice()};
  const user = $('user').value.trim();
  if (!$('user-row').hidden && user) body.user = user;
  const ticket = ++latest;
  if (pending) pending.abort();
  pending = new AbortController();
  try {
    const response = await fetch('/v1/suggest', {
      method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body),
      signal: pending.signal});
    const data = await answerOf(response);
    if (ticket !== latest) return;  // a later request, or a new session, since
    if (!response.ok) {
      takeBack(typed, dropped);
      showSuggestions([]);
      status(`${response.status}: ${data.error || 'error'}`, true);
      return;
    }
    session.splice(0, session.length, ...data.session);  // as the model read it
    showSession();
    showSuggestions(data.suggestions);
    const notes = [];
    if (data.k_returned < data.k) notes.push(`${data.k} asked: the model has no more`);
    if (cut) notes.push(`the query was cut to its first ${maxWords} words`);
    if (dropped.length) {
      notes.push(`the oldest query ("${dropped.join('", "')}") was dropped: the model reads the ` +
                 `last ${maxQueries}`);
    }
    status(`${data.suggestions.filter((s) => s.query.trim()).length} suggestions from ` +
           `${data.model.name} (step ${data.model.step}) in ${data.ms.toFixed(1)} ms` +
           notes.map((note) => `; ${note}`).join(''), false);
    if (String(data.model.step) !== $('model').dataset.step) showModel(data.model.step);  // reloaded
  } catch (error) {
    if (ticket !== latest) return;
    takeBack(typed, dropped);
    status(`no answer: ${error}`, true);
  }
}

// A query the service did not answer (refused, timed out, unreachable) leaves the session as
// it was and goes back to the box, where it can be sent again, unless something new was
// typed there meanwhile.
function takeBack(typed, dropped) {
  session.pop();
  session.unshift(...dropped);
  showSession();
  if (!$('query').value) $('query').value = typed;
}

$('search').addEventListener('submit', (event) => {
  event.preventDefault();
  submit($('query').value);
});
$('new-session').addEventListener('click', () => {
  latest++;  // whatever is still on its way belongs to the session before
  if (pending) pending.abort();
  session.length = 0;
  showSession();
  showSuggestions([]);
  status('new session', false);
  $('query').focus();
});

fetch('/v1/info').then(async (r) => {
  const answer = await answerOf(r);
  if (!r.ok) throw new Error(`${r.status}: ${answer.error || 'error'}`);
  return answer;
}).then((answer) => {
  info = answer;
  maxQueries = info.max_session_queries;
  maxWords = info.max_query_words;
  showModel(info.step);
  $('user-row').hidden = !info.personalises;
}).catch((error) => {
  $('model').textContent = 'the model could not be described';
  status(`no model info: ${error.message || error}`, true);
});
