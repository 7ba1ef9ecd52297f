// The console's only way to the server: /v0 with the API key from session
// storage as the Bearer header. Every datum on screen comes through here.

const KEY = 'shard.key';
const PROJECT = 'shard.project';

export function getKey() {
  return sessionStorage.getItem(KEY) || '';
}

export function setKey(key) {
  // The project chosen belongs to the key that chose it: another key (or
  // none) starts from its own. A key of one project that sent the name of
  // another would be refused (wrong_project) on every request, whoami too,
  // and the tab could not sign in again.
  if (key !== getKey()) sessionStorage.removeItem(PROJECT);
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

// The project a key of every project looks at ('' is the server's default).
export function getProject() {
  return sessionStorage.getItem(PROJECT) || '';
}

export function setProject(p) {
  if (p) sessionStorage.setItem(PROJECT, p);
  else sessionStorage.removeItem(PROJECT);
}

// takeKeyFromFragment moves a key given as #key=<key> (the URL `shard ui`
// prints) into session storage and out of the address bar and history.
export function takeKeyFromFragment() {
  if (!location.hash.startsWith('#')) return;
  const params = new URLSearchParams(location.hash.slice(1));
  const key = params.get('key');
  if (key === null) return;
  if (key) setKey(key);
  history.replaceState(history.state, '', location.pathname + location.search);
}

// ApiError is an answer's {"code","message"}; message is written for people.
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let onUnauthorized = () => {};

// whenUnauthorized sets what a 401 does (back to the key prompt).
export function whenUnauthorized(fn) {
  onUnauthorized = fn;
}

export function headers(extra) {
  const h = { Accept: 'application/json', ...extra };
  const key = getKey();
  if (key) h.Authorization = 'Bearer ' + key;
  const p = getProject();
  if (p) h['Shard-Project'] = p;
  return h;
}

export async function api(method, path, body) {
  const init = { method, headers: headers(), cache: 'no-store', credentials: 'omit' };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, 'unreachable', 'the server did not answer: ' + e.message);
  }
  const text = await res.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    // A proxy's HTML error page: the status says enough.
  }
  if (!res.ok) {
    const err = new ApiError(
      res.status,
      (data && data.code) || 'http_' + res.status,
      (data && data.message) || `${res.status} ${res.statusText}`,
    );
    if (res.status === 401) onUnauthorized(err);
    throw err;
  }
  return data;
}

export const get = (path) => api('GET', path);
export const post = (path, body) => api('POST', path, body === undefined ? {} : body);
export const del = (path) => api('DELETE', path);

// enc escapes one path segment (ids are hex, but names and refs come from
// users).
export const enc = encodeURIComponent;

// covers is auth.Covers: "*" is everything, "area:*" every scope of the area.
export function covers(granted, need) {
  for (const g of granted || []) {
    if (g === '*' || g === need) return true;
    if (g.endsWith(':*') && need.startsWith(g.slice(0, -1))) return true;
  }
  return false;
}

// execURL is the WebSocket exec's address; a browser cannot set headers on
// an upgrade, so the project goes in the query, and the key in the
// subprotocols offered (execProtocols), never in the URL, which a
// browser's console and a proxy's log print whole.
export function execURL(id, req) {
  const u = new URL(`/v0/sandboxes/${enc(id)}/exec`, location.href);
  u.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
  u.hash = '';
  u.search = '';
  u.searchParams.set('request', JSON.stringify(req));
  const p = getProject();
  if (p) u.searchParams.set('project', p);
  return u.toString();
}

// execProtocols are the subprotocols the exec's WebSocket offers: the
// server picks "shard"; "shard.key.<key>" carries the key.
export function execProtocols() {
  const key = getKey();
  return key ? ['shard', `shard.key.${key}`] : ['shard'];
}
