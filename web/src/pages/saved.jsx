// The list pages: checkpoints, snapshots, environments, images, tokens,
// projects (use against quota) and disk usage.
import { useState } from 'preact/hooks';
import { get, del, enc } from '../api.js';
import { Link, usePoll, navigate } from '../router.js';
import { bytes, cpu, ms, time, short, argv } from '../format.js';
import { useSession, Loaded, Mono, Empty, Section, notify } from '../ui.jsx';
import { Confirm, CreateDialog, RestoreDialog } from '../actions.jsx';

function SandboxRef({ id, name }) {
  return (
    <Link to={`/sandboxes/${id}`} title={id}>
      {name || id}
    </Link>
  );
}

export function CheckpointTable({ list, reload, focus }) {
  const { can } = useSession();
  const write = can('sandbox:write');
  const [dialog, setDialog] = useState(null);
  const close = () => setDialog(null);
  return (
    <>
      <table class="list" id="checkpoints">
        <thead>
          <tr>
            <th>ID</th>
            <th>Kind</th>
            <th>Tag</th>
            <th>Of</th>
            <th>Image</th>
            <th>Provider</th>
            <th>Memory</th>
            <th>Size</th>
            <th>Freeze</th>
            <th>Created</th>
            {write ? <th /> : null}
          </tr>
        </thead>
        <tbody>
          {list.length === 0 ? <Empty cols={write ? 11 : 10}>No checkpoints.</Empty> : null}
          {list.map((cp) => (
            <tr key={cp.id} data-id={cp.id} class={focus === cp.id ? 'focus' : ''}>
              <td>
                <Mono>{cp.id}</Mono>
              </td>
              <td>{cp.kind}</td>
              <td>{cp.tag || ''}</td>
              <td>
                <SandboxRef id={cp.sandbox_id} name={cp.sandbox_name} />
              </td>
              <td class="wrap">{cp.image}</td>
              <td>{cp.provider}</td>
              <td title={cp.memory_note || ''}>
                {bytes(cp.memory_bytes)}
                {cp.memory ? <span class="muted small"> {cp.memory}</span> : null}
              </td>
              <td>{bytes(cp.size)}</td>
              <td>{ms(cp.freeze_ms)}</td>
              <td>{time(cp.created_at)}</td>
              {write ? (
                <td class="right">
                  <span class="actions">
                    <button data-action="restore" onClick={() => setDialog({ kind: 'restore', cp })}>
                      Restore…
                    </button>
                    <button class="danger" data-action="remove" onClick={() => setDialog({ kind: 'remove', cp })}>
                      Remove…
                    </button>
                  </span>
                </td>
              ) : null}
            </tr>
          ))}
        </tbody>
      </table>
      {dialog && dialog.kind === 'restore' ? (
        <RestoreDialog cp={dialog.cp} onClose={close} done={(sb) => navigate(`/sandboxes/${sb.id}`)} />
      ) : null}
      {dialog && dialog.kind === 'remove' ? (
        <Confirm
          title={`Remove checkpoint ${dialog.cp.id}`}
          label="Remove"
          onClose={close}
          onConfirm={async () => {
            await del(`/v0/checkpoints/${enc(dialog.cp.id)}`);
            notify('ok', `removed checkpoint ${dialog.cp.id}`);
            reload();
          }}
        >
          <p>
            Remove checkpoint <code>{dialog.cp.id}</code> of {dialog.cp.sandbox_name}? Nothing can be restored or forked
            from it after.
          </p>
        </Confirm>
      ) : null}
    </>
  );
}

export function Checkpoints({ query }) {
  const q = usePoll(() => get('/v0/checkpoints'), []);
  return (
    <Section title="Checkpoints">
      <Loaded q={q}>
        {(d) => <CheckpointTable list={d.checkpoints} reload={q.reload} focus={query.get('focus')} />}
      </Loaded>
    </Section>
  );
}

export function Snapshots({ query }) {
  const { can } = useSession();
  const write = can('sandbox:write');
  const q = usePoll(() => get('/v0/snapshots'), []);
  const [removing, setRemoving] = useState(null);
  const focus = query.get('focus');
  return (
    <Section title="Snapshots">
      <Loaded q={q}>
        {(d) => (
          <table class="list" id="snapshots">
            <thead>
              <tr>
                <th>Name</th>
                <th>ID</th>
                <th>Of</th>
                <th>Image</th>
                <th>Provider</th>
                <th>Disk</th>
                <th>Size</th>
                <th>Created</th>
                {write ? <th /> : null}
              </tr>
            </thead>
            <tbody>
              {d.snapshots.length === 0 ? <Empty cols={write ? 9 : 8}>No snapshots.</Empty> : null}
              {d.snapshots.map((s) => (
                <tr key={s.id} data-id={s.id} class={focus === s.id ? 'focus' : ''}>
                  <td>{s.name}</td>
                  <td>
                    <Mono>{s.id}</Mono>
                  </td>
                  <td>
                    <SandboxRef id={s.sandbox_id} name={s.sandbox_name} />
                  </td>
                  <td class="wrap">{s.image}</td>
                  <td>{s.provider}</td>
                  <td>{bytes(s.disk_bytes)}</td>
                  <td>{bytes(s.size)}</td>
                  <td>{time(s.created_at)}</td>
                  {write ? (
                    <td class="right">
                      <button class="danger" data-action="remove" onClick={() => setRemoving(s)}>
                        Remove…
                      </button>
                    </td>
                  ) : null}
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </Loaded>
      {removing ? (
        <Confirm
          title={`Remove snapshot ${removing.name}`}
          label="Remove"
          onClose={() => setRemoving(null)}
          onConfirm={async () => {
            await del(`/v0/snapshots/${enc(removing.id)}`);
            notify('ok', `removed snapshot ${removing.name}`);
            q.reload();
          }}
        >
          <p>
            Remove snapshot <b>{removing.name}</b> (<code>{removing.id}</code>)?
          </p>
        </Confirm>
      ) : null}
    </Section>
  );
}

// useCreateFrom is a row's "New sandbox…" cell and the create dialog it
// opens, from what from(row) names (the row's image or environment); the
// new sandbox's page opens when it is made.
function useCreateFrom(from) {
  const [row, setRow] = useState(null);
  const cell = (r) => (
    <td class="right">
      <button data-action="create" onClick={() => setRow(r)}>
        New sandbox…
      </button>
    </td>
  );
  const dialog = row ? (
    <CreateDialog from={from(row)} onClose={() => setRow(null)} done={(sb) => navigate(`/sandboxes/${sb.id}`)} />
  ) : null;
  return [cell, dialog];
}

export function Environments({ query }) {
  const { can } = useSession();
  const write = can('sandbox:write');
  const q = usePoll(() => get('/v0/environments'), [], 5000);
  const [newSandbox, createDialog] = useCreateFrom((en) => ({ environment: en.name }));
  const focus = query.get('focus');
  return (
    <Section title="Environments">
      <Loaded q={q}>
        {(d) => (
          <table class="list" id="environments">
            <thead>
              <tr>
                <th>Name</th>
                <th>Image</th>
                <th>Provider</th>
                <th>Bounds</th>
                <th>Setup</th>
                <th>Checkpoint</th>
                <th>Built</th>
                {write ? <th /> : null}
              </tr>
            </thead>
            <tbody>
              {d.environments.length === 0 ? <Empty cols={write ? 8 : 7}>No environments.</Empty> : null}
              {d.environments.map((en) => (
                <tr key={en.name} data-name={en.name} class={focus === en.name ? 'focus' : ''}>
                  <td>{en.name}</td>
                  <td class="wrap">{en.image}</td>
                  <td>{en.provider}</td>
                  <td>
                    {bytes(en.memory_bytes)} · {cpu(en.cpu)} cpu · {bytes(en.disk_bytes)}
                  </td>
                  <td class="wrap">
                    {(en.setup || []).map((c, i) => (
                      <div key={i}>
                        <code class="argv">{argv(c)}</code>
                      </div>
                    ))}
                  </td>
                  <td>
                    <Link to={`/checkpoints?focus=${enc(en.checkpoint)}`}>
                      <Mono>{en.checkpoint}</Mono>
                    </Link>
                  </td>
                  <td>{time(en.created_at)}</td>
                  {write ? newSandbox(en) : null}
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </Loaded>
      {createDialog}
    </Section>
  );
}

export function Images() {
  const { can } = useSession();
  const write = can('sandbox:write');
  const q = usePoll(() => get('/v0/images'), [], 5000);
  const [newSandbox, createDialog] = useCreateFrom((im) => ({ image: im.name }));
  return (
    <Section title="Images">
      <Loaded q={q}>
        {(d) => (
          <table class="list" id="images">
            <thead>
              <tr>
                <th>Name</th>
                <th>Reference</th>
                <th>Digest</th>
                <th>Size</th>
                <th>Layers</th>
                <th>Project</th>
                <th>Pulled</th>
                {write ? <th /> : null}
              </tr>
            </thead>
            <tbody>
              {d.images.length === 0 ? <Empty cols={write ? 8 : 7}>No cached images.</Empty> : null}
              {d.images.map((im) => (
                <tr key={im.ref}>
                  <td>{im.name}</td>
                  <td class="wrap">
                    <Mono>{im.ref}</Mono>
                  </td>
                  <td>
                    <Mono title={im.digest}>{short(im.digest)}</Mono>
                  </td>
                  <td>{bytes(im.size)}</td>
                  <td>{im.layers}</td>
                  <td>{im.project || 'shared'}</td>
                  <td>{time(im.created)}</td>
                  {write ? newSandbox(im) : null}
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </Loaded>
      {createDialog}
    </Section>
  );
}

// Tokens shows API keys by name and scope; the server never gives a key
// back after its creation, and this page never asks.
export function Tokens() {
  const q = usePoll(() => get('/v0/tokens'), [], 5000);
  return (
    <Section title="API keys">
      <Loaded q={q}>
        {(d) => (
          <table class="list" id="tokens">
            <thead>
              <tr>
                <th>Name</th>
                <th>ID</th>
                <th>Project</th>
                <th>Scopes</th>
                <th>Created</th>
              </tr>
            </thead>
            <tbody>
              {d.tokens.length === 0 ? <Empty cols={5}>No API keys.</Empty> : null}
              {d.tokens.map((t) => (
                <tr key={t.id}>
                  <td>{t.name}</td>
                  <td>
                    <Mono>{t.id}</Mono>
                  </td>
                  <td>{t.project}</td>
                  <td>
                    {t.scopes.map((s) => (
                      <span key={s} class="tag">
                        {s}
                      </span>
                    ))}
                  </td>
                  <td>{time(t.created_at)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </Loaded>
    </Section>
  );
}

// OfQuota is a project's use of one bound: "use / limit", marked when it is
// at the limit (what would add to it is refused), or the use alone when the
// project has no such bound; as shard project ls shows it.
function OfQuota({ use, limit, fmt }) {
  if (!(limit > 0)) return <td class="num">{fmt(use || 0)}</td>;
  return (
    <td class={use >= limit ? 'num err-text' : 'num'} title={use >= limit ? 'at its quota' : ''}>
      {fmt(use || 0)} <span class="muted">/ {fmt(limit)}</span>
    </td>
  );
}

const count = (n) => String(n);
const cpus = (m) => cpu(m / 1000);

// Projects shows each project the key may see (every project for a key of
// every project, else its own) with its use against its quota; quotas are
// set by an administrator (shard project set), not here.
export function Projects() {
  const q = usePoll(() => get('/v0/projects'), [], 5000);
  return (
    <Section title="Projects">
      <Loaded q={q}>
        {(d) => (
          <>
            <table class="list" id="projects">
              <thead>
                <tr>
                  <th>Project</th>
                  <th class="num">Sandboxes</th>
                  <th class="num">Memory</th>
                  <th class="num">CPU</th>
                  <th class="num">Disk</th>
                  <th class="num">Saved</th>
                  <th class="num">Ledger</th>
                </tr>
              </thead>
              <tbody>
                {d.projects.length === 0 ? <Empty cols={7}>No projects.</Empty> : null}
                {d.projects.map((p) => {
                  const u = p.use || {};
                  const l = p.quota || {};
                  return (
                    <tr key={p.name} data-name={p.name}>
                      <td>{p.name}</td>
                      <OfQuota use={u.sandboxes} limit={l.max_sandboxes} fmt={count} />
                      <OfQuota use={u.memory_bytes} limit={l.max_memory_bytes} fmt={bytes} />
                      <OfQuota use={u.cpu_millis} limit={l.max_cpu_millis} fmt={cpus} />
                      <OfQuota use={u.disk_bytes} limit={l.max_disk_bytes} fmt={bytes} />
                      <OfQuota use={u.saved_bytes} limit={l.max_saved_bytes} fmt={bytes} />
                      <OfQuota use={u.ledger_bytes} limit={l.max_ledger_bytes} fmt={bytes} />
                    </tr>
                  );
                })}
              </tbody>
            </table>
            <p class="muted small">
              Use / quota; the use alone where the project has no such bound. Memory and CPU are the bounds of its
              running sandboxes and warm spares, disk those of all its sandboxes; saved is what its checkpoints and
              snapshots take. An administrator sets quotas: <code>shard project set NAME --max-sandboxes N …</code>
            </p>
          </>
        )}
      </Loaded>
    </Section>
  );
}

const KINDS = ['images', 'sandboxes', 'snapshots', 'checkpoints', 'environments', 'server'];

export function Disk() {
  const q = usePoll(() => get('/v0/system/df'), [], 5000);
  return (
    <Section title="Disk usage">
      <Loaded q={q}>
        {(d) => {
          const st = d.store || {};
          const h = d.host || {};
          const cap = st.capacity_bytes || 0;
          const pct = (n) => (cap ? Math.min(100, (100 * n) / cap) : 0);
          return (
            <>
              <table class="list narrow" id="df">
                <thead>
                  <tr>
                    <th>Kind</th>
                    <th class="num">Count</th>
                    <th class="num">Size</th>
                  </tr>
                </thead>
                <tbody>
                  {KINDS.map((k) => (
                    <tr key={k}>
                      <td>{k}</td>
                      <td class="num">{k === 'server' ? '' : (d[k] || {}).count}</td>
                      <td class="num">{bytes((d[k] || {}).bytes)}</td>
                    </tr>
                  ))}
                  <tr class="total">
                    <td>total</td>
                    <td />
                    <td class="num">{bytes(d.total_bytes)}</td>
                  </tr>
                </tbody>
              </table>
              <h3>Sandbox store</h3>
              <div class="bar" title="promised / reserved / free">
                <span class="b-promised" style={{ width: pct(st.promised_bytes) + '%' }} />
                <span class="b-reserved" style={{ width: pct(st.reserved_bytes) + '%' }} />
              </div>
              <dl class="info">
                <dt>Capacity</dt>
                <dd>{bytes(st.capacity_bytes)}</dd>
                <dt>Promised</dt>
                <dd>{bytes(st.promised_bytes)}</dd>
                <dt>Reserved</dt>
                <dd>{bytes(st.reserved_bytes)}</dd>
                <dt>Free</dt>
                <dd>{bytes(st.free_bytes)}</dd>
                <dt>On the host</dt>
                <dd>{st.size_bytes ? bytes(st.size_bytes) : '—'}</dd>
                <dt>Grows to</dt>
                <dd>{st.size_bytes ? bytes(st.max_bytes) : 'does not grow (a store shard did not make)'}</dd>
              </dl>
              <h3>Host</h3>
              <dl class="info" id="df-host">
                <dt>Filesystem</dt>
                <dd>{bytes(h.total_bytes)}</dd>
                <dt>Free</dt>
                <dd>{bytes(h.free_bytes)}</dd>
                <dt>Reserve</dt>
                <dd>{bytes(h.reserve_bytes)}</dd>
              </dl>
            </>
          );
        }}
      </Loaded>
    </Section>
  );
}
