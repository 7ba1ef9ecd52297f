import { useEffect, useState } from 'preact/hooks';
import { get, enc } from '../api.js';
import { Link, usePoll, navigate } from '../router.js';
import { bytes, cpu, time, ms, argv, short } from '../format.js';
import { useSession, Loaded, State, Mono, Empty, Section, ErrorBox, Origin } from '../ui.jsx';
import { SandboxActions } from '../actions.jsx';
import { CheckpointTable } from './saved.jsx';

export function SandboxPage({ id }) {
  const { can } = useSession();
  const q = usePoll(() => get(`/v0/sandboxes/${enc(id)}`), [id]);
  return (
    <Loaded q={q}>
      {(sb) => (
        <>
          <div class="page-head">
            <h1>
              {sb.name} <Mono>{sb.id}</Mono> <State state={sb.state} />
            </h1>
            <div class="spacer" />
            <Link to={`/tree/${sb.id}`} class="button">
              Fork tree
            </Link>
            <SandboxActions sb={sb} reload={q.reload} onRemoved={() => navigate('/sandboxes')} />
          </div>
          <Info sb={sb} />
          {can('sandbox:write') ? <TerminalSection sb={sb} /> : null}
          <Ledger session={sb.session} />
          <Section title="Checkpoints">
            <SandboxCheckpoints id={sb.id} />
          </Section>
          {can('secret:read') ? <Grants id={sb.id} /> : null}
          {can('policy:read') ? <Policy id={sb.id} /> : null}
        </>
      )}
    </Loaded>
  );
}

function Info({ sb }) {
  return (
    <dl class="info">
      <dt>Image</dt>
      <dd>
        {sb.image} <Mono title={sb.image_digest}>{short(sb.image_digest)}</Mono>
      </dd>
      <dt>Provider</dt>
      <dd>{sb.provider}</dd>
      {sb.node ? (
        <>
          <dt>Node</dt>
          <dd class="node">{sb.node}</dd>
        </>
      ) : null}
      <dt>Memory</dt>
      <dd>{bytes(sb.memory_bytes)}</dd>
      <dt>CPU</dt>
      <dd>{cpu(sb.cpu)}</dd>
      <dt>Disk</dt>
      <dd>{bytes(sb.disk_bytes)}</dd>
      <dt>PIDs</dt>
      <dd>{sb.pids_limit}</dd>
      <dt>Address</dt>
      <dd>
        <Mono>{sb.ip || '—'}</Mono>
      </dd>
      <dt>OOM kills</dt>
      <dd>{sb.oom_kills}</dd>
      <dt>Session</dt>
      <dd>
        <Mono>{sb.session}</Mono>
      </dd>
      <dt>Project</dt>
      <dd>{sb.project}</dd>
      {sb.origin || sb.parent_id ? (
        <>
          <dt>Origin</dt>
          <dd class="origin">
            <SourceOf sb={sb} />
          </dd>
        </>
      ) : null}
      <dt>Created</dt>
      <dd>{time(sb.created_at)}</dd>
      {sb.started_at ? (
        <>
          <dt>Started</dt>
          <dd>{time(sb.started_at)}</dd>
        </>
      ) : null}
      {sb.stopped_at ? (
        <>
          <dt>Stopped</dt>
          <dd>{time(sb.stopped_at)}</dd>
        </>
      ) : null}
      {sb.error ? (
        <>
          <dt>Error</dt>
          <dd class="err-text">{sb.error}</dd>
        </>
      ) : null}
      <dt>Environment</dt>
      <dd>
        <details>
          <summary>{(sb.env || []).length} variables</summary>
          <pre class="env">{(sb.env || []).join('\n')}</pre>
        </details>
      </dd>
    </dl>
  );
}

// Parent names a sandbox's parent, asked once: by its name while it
// exists, by its short id once it is gone (or while it is asked).
// SourceOf is the sandbox's Origin, its fork's source linked while that
// exists (asked once).
function SourceOf({ sb }) {
  const id = sb.origin ? (sb.origin.kind === 'fork' ? sb.origin.id : '') : sb.parent_id;
  const q = usePoll(() => (id ? get(`/v0/sandboxes/${enc(id)}`) : Promise.resolve(null)), [id], 0);
  // Removed is said only when the server says so (404), not while it is asked.
  if (id && !q.data && !(q.error && q.error.status === 404)) return null;
  return <Origin sb={sb} exists={q.data ? q.data.name : undefined} />;
}

// LazyTerminal evaluates xterm.js (most of the bundle) only when a terminal
// opens: esbuild keeps a dynamic import in the one bundle, in a function the
// browser only pre-parses, so the console's first paint does not pay for it.
function LazyTerminal(props) {
  const [T, setT] = useState(null);
  useEffect(() => {
    import('../terminal.jsx').then((m) => setT(() => m.Terminal));
  }, []);
  return T ? <T {...props} /> : <p class="muted">Loading the terminal…</p>;
}

// TerminalSection stays mounted whatever the sandbox's state (a fork
// freezes it for a moment): an open terminal ends only when its command
// does, or when it is closed.
function TerminalSection({ sb }) {
  const [cmd, setCmd] = useState('sh');
  const [term, setTerm] = useState(null); // {n, argv} of the open terminal
  const running = sb.state === 'running';
  return (
    <Section
      title="Terminal"
      right={
        <form
          class="inline"
          onSubmit={(e) => {
            e.preventDefault();
            const argv = cmd.trim().split(/\s+/).filter(Boolean);
            if (argv.length) setTerm((t) => ({ n: (t ? t.n : 0) + 1, argv }));
          }}
        >
          <input
            name="command"
            class="mono"
            value={cmd}
            onInput={(e) => setCmd(e.currentTarget.value)}
            aria-label="command"
          />
          <button type="submit" data-action="terminal" disabled={!running}>
            {term ? 'New terminal' : 'Open terminal'}
          </button>
          {term ? (
            <button type="button" data-action="terminal-close" onClick={() => setTerm(null)}>
              Close
            </button>
          ) : null}
        </form>
      }
    >
      {term ? (
        <LazyTerminal key={term.n} id={sb.id} argv={term.argv} />
      ) : (
        <p class="muted">
          {running
            ? 'A TTY in the sandbox over the exec WebSocket; closing it hangs up the command.'
            : `The sandbox is ${sb.state}: a terminal needs it running.`}
        </p>
      )}
    </Section>
  );
}

// Ledger reads a session's events page by page, then follows it by asking
// for what came after the last one every two seconds.
function useLedger(session) {
  const [st, setSt] = useState({ events: [], error: null, loaded: false });
  useEffect(() => {
    let alive = true;
    let timer = 0;
    let after = 0;
    let all = [];
    const load = async () => {
      try {
        for (;;) {
          const page = await get(`/v0/ledger/sessions/${enc(session)}/events?after=${after}&limit=1000`);
          if (!alive) return;
          all = all.concat(page.events || []);
          after = Math.max(after, page.next || 0);
          if (!page.more) break;
        }
        setSt({ events: all, error: null, loaded: true });
      } catch (error) {
        if (alive) setSt((s) => ({ ...s, error, loaded: true }));
      }
      if (alive) timer = setTimeout(tick, 2000);
    };
    const tick = () => {
      if (document.hidden) timer = setTimeout(tick, 2000);
      else load();
    };
    setSt({ events: [], error: null, loaded: false });
    load();
    return () => {
      alive = false;
      clearTimeout(timer);
    };
  }, [session]);
  return st;
}

// timeline pairs each exec's start with its end: one row per command.
function timeline(events) {
  const items = [];
  const execs = new Map();
  for (const ev of events) {
    const d = ev.data || {};
    if (ev.type === 'sandbox.exec_started') {
      const it = { kind: 'exec', at: ev.at, seq: ev.seq, start: d, end: null };
      execs.set(d.exec, it);
      items.push(it);
    } else if (ev.type === 'sandbox.exec_finished') {
      const it = execs.get(d.exec);
      if (it) it.end = d;
      else items.push({ kind: 'exec', at: ev.at, seq: ev.seq, start: null, end: d });
    } else {
      items.push({ kind: 'event', at: ev.at, seq: ev.seq, ev });
    }
  }
  return items.reverse();
}

const SHOWN = 500;

function Ledger({ session }) {
  const st = useLedger(session);
  const items = timeline(st.events);
  return (
    <Section
      title={`Ledger`}
      right={
        <span class="muted">
          session <Mono>{session}</Mono>, {st.events.length} events
        </span>
      }
    >
      <ErrorBox error={st.error} />
      {!st.loaded ? (
        <p class="muted">Loading…</p>
      ) : (
        <table class="list timeline" id="ledger">
          <thead>
            <tr>
              <th>Time</th>
              <th>Event</th>
              <th>Detail</th>
              <th>Exit</th>
              <th>Duration</th>
            </tr>
          </thead>
          <tbody>
            {items.length === 0 ? <Empty cols={5}>No events.</Empty> : null}
            {items
              .slice(0, SHOWN)
              .map((it) =>
                it.kind === 'exec' ? <ExecRow key={it.seq} it={it} /> : <EventRow key={it.seq} ev={it.ev} />,
              )}
            {items.length > SHOWN ? <Empty cols={5}>{items.length - SHOWN} earlier entries not shown.</Empty> : null}
          </tbody>
        </table>
      )}
    </Section>
  );
}

function Exit({ end }) {
  if (!end) return <span class="state s-running">running</span>;
  if (end.error)
    return (
      <span class="exit bad" title={end.error}>
        error
      </span>
    );
  const bad = end.exit_code !== 0;
  return (
    <span class={'exit ' + (bad ? 'bad' : 'ok')}>
      {end.exit_code}
      {end.signal ? ` (signal ${end.signal})` : ''}
      {end.timed_out ? ' timed out' : ''}
      {end.oom_killed ? ' OOM' : ''}
    </span>
  );
}

function ExecRow({ it }) {
  const s = it.start || {};
  const e = it.end;
  return (
    <tr class="exec">
      <td class="t">{time(it.at)}</td>
      <td>
        exec{s.tty ? <span class="tag">tty</span> : null}
        {s.replay ? <span class="tag">replay</span> : null}
      </td>
      <td class="wrap">
        <code class="argv">{it.start ? argv(s.argv) : '(start not in the ledger)'}</code>
        {s.user || s.cwd ? (
          <span class="muted small">
            {' '}
            {s.user ? `as ${s.user}` : ''} {s.cwd ? `in ${s.cwd}` : ''}
          </span>
        ) : null}
        {e && e.error ? <div class="small err-text">{e.error}</div> : null}
        {e && (e.stdout_bytes || e.stderr_bytes) ? (
          <div class="small muted">
            out {bytes(e.stdout_bytes || 0)}, err {bytes(e.stderr_bytes || 0)}
          </div>
        ) : null}
      </td>
      <td>
        <Exit end={e} />
      </td>
      <td>{e ? ms(e.duration_ms) : ''}</td>
    </tr>
  );
}

function SbLink({ id, children }) {
  if (!id) return children || null;
  return <Link to={`/sandboxes/${id}`}>{children || <Mono>{id}</Mono>}</Link>;
}

function detail(ev) {
  const d = ev.data || {};
  switch (ev.type) {
    case 'sandbox.created':
      return (
        <>
          {d.image} on {d.provider}
          {d.forked_from ? (
            <>
              , forked from <SbLink id={d.forked_from}>{d.parent_name || d.forked_from}</SbLink>
            </>
          ) : null}
          {d.restored_from ? (
            <>
              , restored from checkpoint <Mono>{d.restored_from}</Mono>
            </>
          ) : null}
          {d.resumed_from ? (
            <>
              , resumed from session <Mono>{d.resumed_from}</Mono>
            </>
          ) : null}
          {d.from_snapshot ? (
            <>
              , from snapshot <Mono>{d.from_snapshot}</Mono>
            </>
          ) : null}
          {d.environment ? <>, from environment {d.environment}</> : null}
        </>
      );
    case 'sandbox.checkpoint_created':
      return (
        <>
          <Mono>{d.checkpoint}</Mono> ({d.kind}
          {d.tag ? `, tag ${d.tag}` : ''}), frozen {ms(d.freeze_ms)}
          {d.memory ? `, memory ${d.memory}` : ''}
        </>
      );
    case 'sandbox.forked':
      return (
        <>
          fork <SbLink id={d.fork}>{d.name || d.fork}</SbLink> from checkpoint <Mono>{d.checkpoint}</Mono>
          {d.tag ? ` (tag ${d.tag})` : ''}
        </>
      );
    case 'sandbox.snapshot_created':
      return (
        <>
          snapshot {d.name} <Mono>{d.snapshot}</Mono>
        </>
      );
    case 'sandbox.stopped':
    case 'sandbox.failed':
      return d.reason || '';
    case 'sandbox.secret_granted':
      return d.secret ? `${d.secret} → ${d.env ? '$' + d.env : d.file}` : '';
    case 'sandbox.secret_ungranted':
      return d.secret || '';
    case 'sandbox.files_written':
      return `${d.path}${d.tar ? ' (archive)' : ''}, ${bytes(d.bytes || 0)}${d.error ? ', stopped: ' + d.error : ''}`;
    case 'sandbox.files_removed':
      return `${d.path}${d.recursive ? ' (recursive)' : ''}`;
    case 'sandbox.fork_hook':
      return `${d.hook} (${d.role})${d.error ? ': ' + d.error : ''}`;
    default:
      return Object.keys(d).length ? <code class="json">{JSON.stringify(d)}</code> : '';
  }
}

function EventRow({ ev }) {
  const d = ev.data || {};
  const hook = ev.type === 'sandbox.fork_hook';
  return (
    <tr class={'ev ev-' + ev.type.replace(/^sandbox\./, '').replace(/[^a-z_]/g, '')}>
      <td class="t">{time(ev.at)}</td>
      <td>{ev.type.replace(/^sandbox\./, '')}</td>
      <td class="wrap">{detail(ev)}</td>
      <td>{hook ? <Exit end={d} /> : null}</td>
      <td>{hook ? ms(d.duration_ms) : ''}</td>
    </tr>
  );
}

function SandboxCheckpoints({ id }) {
  const q = usePoll(() => get(`/v0/sandboxes/${enc(id)}/checkpoints`), [id], 5000);
  return <Loaded q={q}>{(d) => <CheckpointTable list={d.checkpoints} reload={q.reload} />}</Loaded>;
}

function Grants({ id }) {
  const q = usePoll(() => get(`/v0/sandboxes/${enc(id)}/grants`), [id], 5000);
  return (
    <Section title="Grants">
      <Loaded q={q}>
        {(d) => (
          <table class="list" id="grants">
            <thead>
              <tr>
                <th>Secret</th>
                <th>As</th>
                <th>Granted</th>
              </tr>
            </thead>
            <tbody>
              {d.grants.length === 0 ? <Empty cols={3}>No secrets granted.</Empty> : null}
              {d.grants.map((g) => (
                <tr key={g.secret}>
                  <td>
                    <Mono>{g.secret}</Mono>
                  </td>
                  <td>
                    {g.file ? (
                      <>
                        file <Mono>{g.file}</Mono>
                      </>
                    ) : (
                      <>
                        env <Mono>${g.env}</Mono>
                      </>
                    )}
                  </td>
                  <td>{time(g.at)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </Loaded>
    </Section>
  );
}

function Policy({ id }) {
  const q = usePoll(() => get(`/v0/sandboxes/${enc(id)}/policy`), [id], 5000);
  return (
    <Section title="Egress policy">
      <Loaded q={q}>
        {(p) =>
          !p || (!p.deny_all && !(p.allow || []).length && !(p.deny || []).length) ? (
            <p class="muted" id="policy">
              No policy: all egress allowed.
            </p>
          ) : (
            <dl class="info" id="policy">
              <dt>Default</dt>
              <dd>{p.deny_all || (p.allow || []).length ? 'deny what is not allowed' : 'allow what is not denied'}</dd>
              <dt>Allow</dt>
              <dd>
                {(p.allow || []).map((a) => (
                  <Mono key={a}>{a}</Mono>
                ))}
              </dd>
              <dt>Deny</dt>
              <dd>
                {(p.deny || []).map((a) => (
                  <Mono key={a}>{a}</Mono>
                ))}
              </dd>
            </dl>
          )
        }
      </Loaded>
    </Section>
  );
}
