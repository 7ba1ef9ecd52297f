// Small pieces every page uses: the session (who the key is and what it
// may do), notices, tables, dialogs.
import { createContext } from 'preact';
import { useContext, useEffect, useRef, useState } from 'preact/hooks';
import { covers } from './api.js';
import { Link } from './router.js';

export const Session = createContext(null);

// useSession is the signed-in key: me (GET /v0/whoami), can(scope), and
// the providers' abilities (GET /v0/capabilities).
export function useSession() {
  return useContext(Session);
}

export function makeSession(me, providers) {
  const can = (scope) => !!me && covers(me.scopes, scope);
  const provider = (name) => (providers || []).find((p) => p.name === name);
  return { me, can, providers: providers || [], provider };
}

// Notices: one line each under the top bar; errors stay until dismissed.
const noticeListeners = new Set();
let notices = [];
let nextNotice = 1;

export function notify(kind, text) {
  const n = { id: nextNotice++, kind, text };
  notices = [...notices.slice(-4), n];
  noticeListeners.forEach((fn) => fn(notices));
  if (kind !== 'error') setTimeout(() => dismiss(n.id), 6000);
}

function dismiss(id) {
  notices = notices.filter((n) => n.id !== id);
  noticeListeners.forEach((fn) => fn(notices));
}

export function Notices() {
  const [list, setList] = useState(notices);
  useEffect(() => {
    noticeListeners.add(setList);
    return () => noticeListeners.delete(setList);
  }, []);
  if (!list.length) return null;
  return (
    <div class="notices">
      {list.map((n) => (
        <div key={n.id} class={'notice ' + n.kind} role={n.kind === 'error' ? 'alert' : 'status'}>
          <span>{n.text}</span>
          <button class="link" aria-label="dismiss" onClick={() => dismiss(n.id)}>
            ×
          </button>
        </div>
      ))}
    </div>
  );
}

export function ErrorBox({ error }) {
  if (!error) return null;
  return (
    <div class="error" role="alert">
      {error.code ? <code>{error.code}</code> : null} {error.message || String(error)}
    </div>
  );
}

// Loading shows the page's error above what it last loaded.
export function Loaded({ q, children }) {
  if (q.data === undefined) {
    if (q.error) return <ErrorBox error={q.error} />;
    return <p class="muted">Loading…</p>;
  }
  return (
    <>
      <ErrorBox error={q.error} />
      {children(q.data)}
    </>
  );
}

export function State({ state }) {
  return <span class={'state s-' + String(state).replace(/[^a-z]/g, '')}>{state}</span>;
}

export function Mono({ children, title }) {
  return (
    <code class="mono" title={title}>
      {children}
    </code>
  );
}

// SandboxRef names a sandbox by its name, linked to its page; without a
// name (it is gone, or not yet known) by its short id, unlinked, the whole
// id on hover.
export function SandboxRef({ id, name }) {
  if (name) {
    return (
      <Link to={`/sandboxes/${id}`} class="sandbox-ref">
        {name}
      </Link>
    );
  }
  return <Mono title={id}>{id.slice(0, 6)}</Mono>;
}

// Origin says what a sandbox was made from (its `origin`), by the names the
// server recorded then: a sandbox made from an environment once showed the
// id of the environment's setup sandbox, removed at once. A fork's source
// is a link while it exists (exists: its current name, or undefined once
// removed); short leaves the checkpoint out (the list).
export function Origin({ sb, exists, short }) {
  const o = sb.origin;
  if (!o) {
    // A sandbox of an older server: only its parent's id.
    if (!sb.parent_id) return null;
    return exists ? (
      <SandboxRef id={sb.parent_id} name={exists} />
    ) : (
      <span class="removed">
        <Mono title={sb.parent_id}>{sb.parent_id.slice(0, 6)}</Mono> (removed)
      </span>
    );
  }
  const ck = o.checkpoint && !short ? <span class="muted">, checkpoint {o.checkpoint}</span> : null;
  switch (o.kind) {
    case 'fork':
      return (
        <span>
          fork of {exists ? <SandboxRef id={o.id} name={exists} /> : <span class="removed">{o.name || o.id} (removed)</span>}
          {ck}
        </span>
      );
    case 'checkpoint':
      return <span>checkpoint {o.name ? `${o.name} (${o.id})` : o.id}</span>;
    case 'session':
      return (
        <span>
          resume of session {o.name}
          {ck}
        </span>
      );
    default:
      return (
        <span>
          {o.kind} {o.name || o.id}
        </span>
      );
  }
}

export function Empty({ cols, children }) {
  return (
    <tr>
      <td colSpan={cols} class="muted empty">
        {children}
      </td>
    </tr>
  );
}

export function Dialog({ title, onClose, children }) {
  const ref = useRef();
  useEffect(() => {
    const d = ref.current;
    if (d && !d.open) d.showModal();
    const first = d && d.querySelector('input, select, button.primary');
    if (first) first.focus();
  }, []);
  return (
    <dialog ref={ref} class="dialog" onClose={onClose}>
      <h3>{title}</h3>
      {children}
    </dialog>
  );
}

// useAction runs one request at a time for a button or form: busy while it
// runs, its API error kept to show.
export function useAction() {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState(null);
  const run = async (fn) => {
    setBusy(true);
    setError(null);
    try {
      return await fn();
    } catch (e) {
      setError(e);
      throw e;
    } finally {
      setBusy(false);
    }
  };
  return { busy, error, run, setError };
}

export function Field({ label, hint, children }) {
  return (
    <label class="field">
      <span class="label">{label}</span>
      {children}
      {hint ? <span class="hint">{hint}</span> : null}
    </label>
  );
}

export function Section({ title, right, children }) {
  return (
    <section class="section">
      <div class="section-head">
        <h2>{title}</h2>
        <div class="spacer" />
        {right}
      </div>
      {children}
    </section>
  );
}
