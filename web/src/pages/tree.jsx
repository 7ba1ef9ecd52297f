// The fork tree: each lineage drawn as a graph, left to right, laid out by
// d3-hierarchy and drawn as SVG by preact (names are text nodes, never
// markup).
import { useState } from 'preact/hooks';
import { hierarchy, tree as layout } from 'd3-hierarchy';
import { get, enc } from '../api.js';
import { Link, usePoll, navigate } from '../router.js';
import { time } from '../format.js';
import { Loaded, Section, Mono } from '../ui.jsx';

const DX = 48; // between siblings: a label above each node, a line below
const DY = 190; // between generations

function cut(s, max) {
  return s.length > max ? s.slice(0, max - 1) + '…' : s;
}

function label(n) {
  return cut(n.kind === 'checkpoint' ? n.name || n.id.slice(0, 8) : n.name || n.id, 22);
}

// gone says which removed sandboxes came from n and are left out of the
// tree (removed_sandboxes): why a kept checkpoint with nothing below it is
// there. '' if none.
function gone(n) {
  const g = n.removed_sandboxes || [];
  if (g.length === 0) return '';
  return g.length === 1 ? `${cut(g[0].name || g[0].id, 10)} removed` : `${g.length} removed`;
}

function sub(n) {
  let s;
  if (n.kind === 'sandbox') s = n.state;
  else if (n.kind === 'checkpoint') s = n.via && n.via !== 'checkpoint' ? `${n.via} checkpoint` : 'checkpoint';
  else s = n.kind + (n.removed ? ', removed' : '');
  const g = gone(n);
  return g ? `${s} · ${g}` : s;
}

// removedSince lists the removed sandboxes n names, for its tooltip.
function removedSince(n) {
  const g = n.removed_sandboxes || [];
  return g.length ? '\nremoved since: ' + g.map((s) => `${s.via ? s.via + ' ' : ''}${s.name || s.id}`).join(', ') : '';
}

// target is where a click on a node goes.
function target(n) {
  if (n.removed) return null;
  switch (n.kind) {
    case 'sandbox':
      return `/sandboxes/${n.id}`;
    case 'checkpoint':
      return `/checkpoints?focus=${enc(n.id)}`;
    case 'snapshot':
      return `/snapshots?focus=${enc(n.id)}`;
    case 'environment':
      return `/environments?focus=${enc(n.id)}`;
  }
  return null;
}

function Shape({ n }) {
  switch (n.kind) {
    case 'sandbox':
      return <rect x="-7" y="-7" width="14" height="14" rx="3" />;
    case 'checkpoint':
      return <circle r="5.5" />;
    case 'snapshot':
      return <rect x="-5.5" y="-5.5" width="11" height="11" transform="rotate(45)" />;
    default:
      return <polygon points="-7,0 -3.5,-6 3.5,-6 7,0 3.5,6 -3.5,6" />;
  }
}

function Lineage({ root }) {
  const h = hierarchy(root, (n) => n.children);
  layout().nodeSize([DX, DY])(h);
  let minX = Infinity;
  let maxX = -Infinity;
  let maxY = 0;
  h.each((d) => {
    minX = Math.min(minX, d.x);
    maxX = Math.max(maxX, d.x);
    maxY = Math.max(maxY, d.y);
  });
  const width = maxY + DY + 20;
  const height = maxX - minX + 2 * DX;
  return (
    <svg
      class="lineage"
      width={width}
      height={height}
      viewBox={`-20 ${minX - DX} ${width} ${height}`}
      role="group"
      aria-label={`lineage of ${root.name || root.id}`}
    >
      <g class="links">
        {h.links().map((l) => {
          const mid = (l.source.y + l.target.y) / 2;
          return (
            <path
              key={l.source.data.kind + l.source.data.id + '>' + l.target.data.kind + l.target.data.id}
              class={l.target.data.removed ? 'removed' : ''}
              d={`M${l.source.y},${l.source.x}C${mid},${l.source.x} ${mid},${l.target.x} ${l.target.y},${l.target.x}`}
            />
          );
        })}
      </g>
      {h.descendants().map((d) => {
        const n = d.data;
        const to = target(n);
        const go = () => to && navigate(to);
        return (
          <g
            key={n.kind + n.id}
            class={`node k-${n.kind} s-${String(n.state).replace(/[^a-z]/g, '')}${n.removed ? ' removed' : ''}${to ? ' link' : ''}`}
            transform={`translate(${d.y},${d.x})`}
            data-kind={n.kind}
            data-id={n.id}
            data-name={n.name || ''}
            role={to ? 'link' : undefined}
            tabIndex={to ? 0 : undefined}
            onClick={go}
            onKeyDown={(e) => (e.key === 'Enter' ? go() : null)}
          >
            <title>
              {`${n.kind} ${n.name ? n.name + ' ' : ''}${n.id}\n${n.state}${n.via ? ', via ' + n.via : ''}\n${time(n.at)}${n.image ? '\n' + n.image : ''}${n.provider ? ' on ' + n.provider : ''}${removedSince(n)}`}
            </title>
            {/* The whole node answers a click, not only its shape and text. */}
            <rect class="hit" x="-10" y="-24" width={DY - 40} height="46" />
            <Shape n={n} />
            <text x="-7" y="-12">
              {label(n)}
            </text>
            <text x="-7" y="21" class="sub">
              {sub(n)}
            </text>
          </g>
        );
      })}
    </svg>
  );
}

export function TreePage({ id }) {
  const [all, setAll] = useState(false);
  const path = id ? `/v0/sandboxes/${enc(id)}/tree` : '/v0/tree';
  const q = usePoll(() => get(path + (all ? '?all=true' : '')), [path, all]);
  return (
    <Section
      title={id ? 'Fork tree' : 'Fork trees'}
      right={
        <>
          {id ? (
            <span class="muted">
              of{' '}
              <Link to={`/sandboxes/${id}`}>
                <Mono>{id}</Mono>
              </Link>{' '}
              · <Link to="/tree">every lineage</Link>
            </span>
          ) : null}
          <label class="check">
            <input type="checkbox" checked={all} onChange={(e) => setAll(e.currentTarget.checked)} /> show removed
          </label>
        </>
      }
    >
      <div class="legend muted small">
        <svg width="14" height="14" viewBox="-7 -7 14 14" class="node k-sandbox s-running">
          <rect x="-6" y="-6" width="12" height="12" rx="3" />
        </svg>{' '}
        sandbox{' '}
        <svg width="14" height="14" viewBox="-7 -7 14 14" class="node k-checkpoint">
          <circle r="5" />
        </svg>{' '}
        checkpoint{' '}
        <svg width="14" height="14" viewBox="-7 -7 14 14" class="node k-snapshot">
          <rect x="-4.5" y="-4.5" width="9" height="9" transform="rotate(45)" />
        </svg>{' '}
        snapshot{' '}
        <svg width="14" height="14" viewBox="-7 -7 14 14" class="node k-environment">
          <polygon points="-6,0 -3,-5 3,-5 6,0 3,5 -3,5" />
        </svg>{' '}
        environment · click a node to open it
      </div>
      <Loaded q={q}>
        {(d) =>
          d.roots.length === 0 ? (
            <p class="muted">Nothing here yet.</p>
          ) : (
            <div class="trees" id="tree">
              {d.roots.map((r) => (
                <div class="tree-box" key={r.kind + r.id}>
                  <Lineage root={r} />
                </div>
              ))}
            </div>
          )
        }
      </Loaded>
    </Section>
  );
}
