// shard's web console: the key prompt, the top bar and the pages. Every
// datum comes from /v0 with the key; what the key's scopes do not allow is
// not shown.
import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import './style.css';
import { get, getKey, setKey, getProject, setProject, takeKeyFromFragment, whenUnauthorized, ApiError } from './api.js';
import { useRoute, match, Link, usePoll } from './router.js';
import { Session, makeSession, useSession, Notices, ErrorBox } from './ui.jsx';
import { Sandboxes } from './pages/sandboxes.jsx';
import { SandboxPage } from './pages/sandbox.jsx';
import { TreePage } from './pages/tree.jsx';
import { Checkpoints, Snapshots, Environments, Images, Tokens, Projects, Disk } from './pages/saved.jsx';

takeKeyFromFragment();

const PAGES = [
  { to: '/sandboxes', label: 'Sandboxes', scope: 'sandbox:read' },
  { to: '/tree', label: 'Fork tree', scope: 'sandbox:read' },
  { to: '/checkpoints', label: 'Checkpoints', scope: 'sandbox:read' },
  { to: '/snapshots', label: 'Snapshots', scope: 'sandbox:read' },
  { to: '/environments', label: 'Environments', scope: 'sandbox:read' },
  { to: '/images', label: 'Images', scope: 'sandbox:read' },
  { to: '/tokens', label: 'API keys', scope: 'token:read' },
  { to: '/projects', label: 'Projects', scope: 'sandbox:read' },
  { to: '/df', label: 'Disk', scope: 'sandbox:read' },
];

function Login({ error, onKey }) {
  const [key, set] = useState('');
  const [busy, setBusy] = useState(false);
  const submit = async (e) => {
    e.preventDefault();
    setBusy(true);
    // A refused key is cleared, to be typed again.
    if (!(await onKey(key.trim()))) set('');
    setBusy(false);
  };
  return (
    <div class="login">
      <form onSubmit={submit} id="login">
        <h1>shard</h1>
        <p class="muted">
          An API key (from <code>shard token create</code>) opens the console for this browser tab.
        </p>
        <label class="field">
          <span class="label">API key</span>
          {/* No name: the key is never part of a form's submission. */}
          <input
            id="key"
            type="password"
            autocomplete="off"
            required
            value={key}
            onInput={(e) => set(e.currentTarget.value)}
          />
        </label>
        <ErrorBox error={error} />
        <div class="buttons">
          <button type="submit" class="primary" disabled={busy}>
            {busy ? 'Checking…' : 'Sign in'}
          </button>
        </div>
      </form>
    </div>
  );
}

function ProjectPicker() {
  const { me } = useSession();
  if (!(me.all_projects || me.project === '*')) return <span class="who-project">project {me.project}</span>;
  return <ProjectSelect />;
}

// ProjectSelect lets a key of every project choose the one it looks at.
function ProjectSelect() {
  const q = usePoll(() => get('/v0/projects'), [], 0);
  const list = (q.data && q.data.projects) || [];
  const cur = getProject();
  return (
    <select
      class="who-project"
      aria-label="project"
      value={cur}
      onChange={(e) => {
        setProject(e.currentTarget.value);
        location.reload();
      }}
    >
      <option value="">default project</option>
      {list
        .filter((p) => p.name !== 'default')
        .map((p) => (
          <option key={p.name} value={p.name}>
            project {p.name}
          </option>
        ))}
      {cur && !list.some((p) => p.name === cur) ? <option value={cur}>project {cur}</option> : null}
    </select>
  );
}

function TopBar({ path, onSignOut }) {
  const { me, can } = useSession();
  return (
    <header class="top">
      <Link to="/sandboxes" class="brand">
        shard
      </Link>
      <nav>
        {PAGES.filter((p) => can(p.scope)).map((p) => (
          <Link key={p.to} to={p.to} class={path === p.to || path.startsWith(p.to + '/') ? 'on' : ''}>
            {p.label}
          </Link>
        ))}
      </nav>
      <div class="spacer" />
      <ProjectPicker />
      <span class="who" title={(me.scopes || []).join(' ')} id="who">
        {me.name}
      </span>
      {getKey() ? (
        <button class="link" onClick={onSignOut} id="signout">
          Sign out
        </button>
      ) : null}
    </header>
  );
}

function Page({ route }) {
  const { can } = useSession();
  const p = route.path.replace(/\/+$/, '') || '/';
  let m;
  if (p === '/' || p === '/sandboxes') {
    if (!can('sandbox:read') && can('token:read')) return <Tokens />;
    return <Sandboxes />;
  }
  if ((m = match('/sandboxes/:id', p))) return <SandboxPage id={m.id} key={m.id} />;
  if (p === '/tree') return <TreePage />;
  if ((m = match('/tree/:id', p))) return <TreePage id={m.id} key={m.id} />;
  if (p === '/checkpoints') return <Checkpoints query={route.query} />;
  if (p === '/snapshots') return <Snapshots query={route.query} />;
  if (p === '/environments') return <Environments query={route.query} />;
  if (p === '/images') return <Images />;
  if (p === '/tokens') return <Tokens />;
  if (p === '/projects') return <Projects />;
  if (p === '/df') return <Disk />;
  return (
    <p>
      No page here. <Link to="/sandboxes">Sandboxes</Link>
    </p>
  );
}

function App() {
  const route = useRoute();
  // session: undefined while asking who the key is, null for the prompt.
  const [session, setSession] = useState(undefined);
  const [error, setError] = useState(null);

  const signIn = async () => {
    if (!getKey()) {
      setSession(null);
      return false;
    }
    try {
      // Both at once: the first page waits on them.
      const [me, providers] = await Promise.all([
        get('/v0/whoami'),
        // A key without sandbox:read has no providers to know.
        get('/v0/capabilities').then(
          (c) => c.providers,
          () => [],
        ),
      ]);
      setError(null);
      setSession(makeSession(me, providers));
      return true;
    } catch (e) {
      // A 401 was handled by whenUnauthorized below.
      if (!(e instanceof ApiError && e.status === 401)) setError(e);
      setSession(null);
      return false;
    }
  };

  useEffect(() => {
    whenUnauthorized((e) => {
      // The first 401 of a key says why; the others of its requests in
      // flight find it gone already.
      if (!getKey()) return;
      setKey('');
      setError(e);
      setSession(null);
    });
    signIn();
  }, []);

  useEffect(() => {
    const page = PAGES.find((p) => route.path.startsWith(p.to));
    document.title = (page ? page.label + ' · ' : '') + 'shard';
  }, [route.path]);

  if (session === undefined) return <p class="muted boot">Loading…</p>;
  if (session === null)
    return (
      <Login
        error={error}
        onKey={async (k) => {
          setKey(k);
          return signIn();
        }}
      />
    );
  return (
    <Session.Provider value={session}>
      <TopBar
        path={route.path}
        onSignOut={() => {
          setKey('');
          setProject('');
          setError(null);
          setSession(null);
        }}
      />
      <Notices />
      <main>
        <Page route={route} />
      </main>
    </Session.Provider>
  );
}

// index.html paints a shell before this script runs; the app replaces it.
document.getElementById('boot').remove();
render(<App />, document.getElementById('app'));
