import { useEffect, useState } from 'preact/hooks';
import { get } from '../api.js';
import { Link, usePoll } from '../router.js';
import { bytes, cpu, ago } from '../format.js';
import { useSession, Loaded, State, Mono, Empty, Section, Origin } from '../ui.jsx';
import { SandboxActions, CreateDialog } from '../actions.jsx';

export function Bounds({ sb }) {
  return (
    <span class="bounds">
      {bytes(sb.memory_bytes)} · {cpu(sb.cpu)} cpu · {bytes(sb.disk_bytes)} disk · {sb.pids_limit} pids
    </span>
  );
}

// shown marks (once a page load) when the sandboxes first showed, for
// BenchmarkConsoleFirstPaint and anyone timing the console.
let shown = false;

export function Sandboxes() {
  const { can } = useSession();
  const q = usePoll(() => get('/v0/sandboxes'), []);
  useEffect(() => {
    if (q.data && !shown) {
      shown = true;
      performance.mark('shard:sandboxes');
    }
  }, [q.data]);
  const [creating, setCreating] = useState(false);
  const write = can('sandbox:write');
  return (
    <Section
      title="Sandboxes"
      right={
        write ? (
          <button class="primary" data-action="create" onClick={() => setCreating(true)}>
            New sandbox…
          </button>
        ) : null
      }
    >
      {creating ? <CreateDialog onClose={() => setCreating(false)} done={q.reload} /> : null}
      <Loaded q={q}>
        {(d) => {
          const names = new Map(d.sandboxes.map((sb) => [sb.id, sb.name]));
          // A node is named only in a cluster: a single server has no Node column.
          const cluster = d.sandboxes.some((sb) => sb.node);
          const cols = 8 + (cluster ? 1 : 0) + (write ? 1 : 0);
          return (
            <table class="list" id="sandboxes">
              <thead>
                <tr>
                  <th>Name</th>
                  <th>ID</th>
                  <th>State</th>
                  <th>Provider</th>
                  {cluster ? <th>Node</th> : null}
                  <th>Image</th>
                  <th>Bounds</th>
                  <th>Address</th>
                  <th>Created</th>
                  {write ? <th /> : null}
                </tr>
              </thead>
              <tbody>
                {d.sandboxes.length === 0 ? (
                  <Empty cols={cols}>No sandboxes.</Empty>
                ) : (
                  d.sandboxes.map((sb) => (
                    <tr key={sb.id} data-id={sb.id} data-name={sb.name} data-state={sb.state}>
                      <td>
                        <Link to={`/sandboxes/${sb.id}`}>{sb.name}</Link>
                        {sb.parent_id || (sb.origin && sb.origin.kind !== 'image') ? (
                          <span class="muted small origin">
                            {' '}
                            ← <Origin sb={sb} exists={names.get(sb.origin ? sb.origin.id : sb.parent_id)} short />
                          </span>
                        ) : null}
                      </td>
                      <td>
                        <Mono>{sb.id}</Mono>
                      </td>
                      <td>
                        <State state={sb.state} />
                        {sb.error ? <div class="small err-text">{sb.error}</div> : null}
                      </td>
                      <td>{sb.provider}</td>
                      {cluster ? <td class="node">{sb.node || ''}</td> : null}
                      <td class="wrap">{sb.image}</td>
                      <td>
                        <Bounds sb={sb} />
                      </td>
                      <td>
                        <Mono>{sb.ip || ''}</Mono>
                      </td>
                      <td title={sb.created_at}>{ago(sb.created_at)}</td>
                      {write ? (
                        <td class="right">
                          <SandboxActions sb={sb} reload={q.reload} />
                        </td>
                      ) : null}
                    </tr>
                  ))
                )}
              </tbody>
            </table>
          );
        }}
      </Loaded>
    </Section>
  );
}
