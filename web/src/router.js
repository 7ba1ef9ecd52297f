import { h } from 'preact';
import { useEffect, useState, useRef, useCallback } from 'preact/hooks';

// The console lives under /ui; its pages are real paths there (the server
// answers index.html for any of them, so a reload stays on the page).
export const BASE = '/ui';

const listeners = new Set();

function current() {
  let p = location.pathname;
  if (p.startsWith(BASE)) p = p.slice(BASE.length);
  return { path: p || '/', query: new URLSearchParams(location.search) };
}

export function navigate(to, replace = false) {
  if (replace) history.replaceState(null, '', BASE + to);
  else history.pushState(null, '', BASE + to);
  window.scrollTo(0, 0);
  for (const fn of listeners) fn();
}

addEventListener('popstate', () => {
  for (const fn of listeners) fn();
});

export function useRoute() {
  const [r, setR] = useState(current);
  useEffect(() => {
    const fn = () => setR(current());
    listeners.add(fn);
    return () => listeners.delete(fn);
  }, []);
  return r;
}

// match returns the path's parameters against a pattern like
// /sandboxes/:id, or null.
export function match(pattern, path) {
  const ps = pattern.split('/');
  const xs = path.split('/');
  if (ps.length !== xs.length) return null;
  const out = {};
  for (let i = 0; i < ps.length; i++) {
    if (ps[i].startsWith(':')) {
      if (!xs[i]) return null;
      try {
        out[ps[i].slice(1)] = decodeURIComponent(xs[i]);
      } catch {
        return null;
      }
    } else if (ps[i] !== xs[i]) return null;
  }
  return out;
}

export function Link({ to, children, ...rest }) {
  const onClick = (e) => {
    if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    navigate(to);
  };
  return h('a', { href: BASE + to, onClick, ...rest }, children);
}

// usePoll loads fn() now and every interval while the page is visible;
// reload() loads at once (after an action). The last good data stays on
// screen while a later load fails.
export function usePoll(fn, deps, interval = 2000) {
  const [state, setState] = useState({ data: undefined, error: null, loading: true });
  const kick = useRef(() => {});
  useEffect(() => {
    let alive = true;
    let timer = 0;
    let seq = 0;
    const load = async () => {
      clearTimeout(timer);
      const mine = ++seq;
      try {
        const data = await fn();
        if (alive && mine === seq) setState({ data, error: null, loading: false });
      } catch (error) {
        if (alive && mine === seq) setState((s) => ({ data: s.data, error, loading: false }));
      }
      if (alive && mine === seq && interval > 0) timer = setTimeout(tick, interval);
    };
    const tick = () => {
      if (document.hidden) timer = setTimeout(tick, interval);
      else load();
    };
    kick.current = load;
    setState({ data: undefined, error: null, loading: true });
    load();
    return () => {
      alive = false;
      clearTimeout(timer);
    };
  }, deps);
  const reload = useCallback(() => kick.current(), []);
  return { ...state, reload };
}
