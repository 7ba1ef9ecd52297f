// The actions that change things: each shown only to a key with
// sandbox:write, each ending in the API's own message when refused.
import { useState } from 'preact/hooks';
import { post, del, get, enc } from './api.js';
import { useSession, useAction, Dialog, ErrorBox, Field, notify } from './ui.jsx';
import { usePoll } from './router.js';

// Confirm asks before an action that cannot be undone.
export function Confirm({ title, children, label, onConfirm, onClose }) {
  const a = useAction();
  const submit = async (e) => {
    e.preventDefault();
    try {
      await a.run(onConfirm);
      onClose();
    } catch {
      // shown in the dialog
    }
  };
  return (
    <Dialog title={title} onClose={onClose}>
      <form onSubmit={submit}>
        <div class="dialog-body">{children}</div>
        <ErrorBox error={a.error} />
        <DialogButtons onClose={onClose} busy={a.busy} action="confirm" label={label} danger />
      </form>
    </Dialog>
  );
}

// DialogButtons are a dialog's Cancel and its submit button, which says
// busyLabel (label and an ellipsis if none) while the request is under way.
function DialogButtons({ onClose, busy, action, label, busyLabel, danger }) {
  return (
    <div class="buttons">
      <button type="button" onClick={onClose}>
        Cancel
      </button>
      <button type="submit" class={danger ? 'danger primary' : 'primary'} data-action={action} disabled={busy}>
        {busy ? busyLabel || label + '…' : label}
      </button>
    </div>
  );
}

function names(list) {
  return (list || []).map((s) => s.name).join(', ');
}

function ForkDialog({ sb, onClose, done }) {
  const [name, setName] = useState('');
  const [count, setCount] = useState('1');
  const [tag, setTag] = useState('');
  const a = useAction();
  const submit = async (e) => {
    e.preventDefault();
    const body = {};
    if (name) body.name = name;
    if (tag) body.tag = tag;
    const n = Number(count);
    if (count && n !== 1) body.count = n;
    try {
      const res = await a.run(() => post(`/v0/sandboxes/${enc(sb.id)}/fork`, body));
      notify('ok', `forked ${sb.name}: ${names(res.sandboxes)}`);
      onClose();
      done();
    } catch {
      // shown in the dialog
    }
  };
  return (
    <Dialog title={`Fork ${sb.name}`} onClose={onClose}>
      <form onSubmit={submit}>
        <p class="muted">
          A fork copies the running sandbox's files, memory and processes; the source freezes for a moment and carries
          on.
        </p>
        <Field label="Name" hint="With a count above 1, a prefix: NAME-1 … NAME-N. Empty: the fork's id.">
          <input name="name" value={name} onInput={(e) => setName(e.currentTarget.value)} autocomplete="off" />
        </Field>
        <Field label="Count">
          <input
            name="count"
            type="number"
            min="1"
            max="64"
            value={count}
            onInput={(e) => setCount(e.currentTarget.value)}
          />
        </Field>
        <Field label="Tag" hint="Kept with the checkpoint in the source's ledger.">
          <input name="tag" value={tag} onInput={(e) => setTag(e.currentTarget.value)} autocomplete="off" />
        </Field>
        <ErrorBox error={a.error} />
        <DialogButtons onClose={onClose} busy={a.busy} action="fork-submit" label="Fork" busyLabel="Forking…" />
      </form>
    </Dialog>
  );
}

function CheckpointDialog({ sb, onClose, done }) {
  const [tag, setTag] = useState('');
  const a = useAction();
  const submit = async (e) => {
    e.preventDefault();
    try {
      const cp = await a.run(() => post(`/v0/sandboxes/${enc(sb.id)}/checkpoints`, tag ? { tag } : {}));
      notify('ok', `checkpoint ${cp.id} of ${sb.name}`);
      onClose();
      done();
    } catch {
      // shown in the dialog
    }
  };
  return (
    <Dialog title={`Checkpoint ${sb.name}`} onClose={onClose}>
      <form onSubmit={submit}>
        <p class="muted">Saves the running sandbox's memory, processes and files; it freezes for a moment.</p>
        <Field label="Tag">
          <input name="tag" value={tag} onInput={(e) => setTag(e.currentTarget.value)} autocomplete="off" />
        </Field>
        <ErrorBox error={a.error} />
        <DialogButtons onClose={onClose} busy={a.busy} action="checkpoint-submit" label="Checkpoint" busyLabel="Saving…" />
      </form>
    </Dialog>
  );
}

// SandboxActions are a sandbox's buttons: what its state allows and its
// provider can do, for a key that may write.
export function SandboxActions({ sb, reload, onRemoved }) {
  const { can, provider } = useSession();
  const [dialog, setDialog] = useState(null);
  const [busy, setBusy] = useState('');
  if (!can('sandbox:write')) return null;
  const p = provider(sb.provider);
  const running = sb.state === 'running';
  const startable = sb.state === 'stopped' || sb.state === 'failed';
  const simple = async (verb, path) => {
    setBusy(verb);
    try {
      await post(path);
      notify('ok', `${verb} ${sb.name}`);
    } catch (e) {
      notify('error', e.message);
    } finally {
      setBusy('');
      reload();
    }
  };
  const close = () => setDialog(null);
  return (
    <span class="actions">
      {running ? (
        <button
          data-action="stop"
          disabled={!!busy}
          onClick={() => simple('stopped', `/v0/sandboxes/${enc(sb.id)}/stop`)}
        >
          {busy ? 'Stopping…' : 'Stop'}
        </button>
      ) : null}
      {startable ? (
        <button
          data-action="start"
          disabled={!!busy}
          onClick={() => simple('started', `/v0/sandboxes/${enc(sb.id)}/start`)}
        >
          {busy ? 'Starting…' : 'Start'}
        </button>
      ) : null}
      {running && (!p || p.fork) ? (
        <button data-action="fork" onClick={() => setDialog('fork')}>
          Fork…
        </button>
      ) : null}
      {running && (!p || p.checkpoint) ? (
        <button data-action="checkpoint" onClick={() => setDialog('checkpoint')}>
          Checkpoint…
        </button>
      ) : null}
      <button class="danger" data-action="remove" onClick={() => setDialog('remove')}>
        Remove…
      </button>
      {dialog === 'fork' ? <ForkDialog sb={sb} onClose={close} done={reload} /> : null}
      {dialog === 'checkpoint' ? <CheckpointDialog sb={sb} onClose={close} done={reload} /> : null}
      {dialog === 'remove' ? (
        <Confirm
          title={`Remove ${sb.name}`}
          label="Remove"
          onClose={close}
          onConfirm={async () => {
            await del(`/v0/sandboxes/${enc(sb.id)}?force=true`);
            notify('ok', `removed ${sb.name}`);
            (onRemoved || reload)();
          }}
        >
          <p>
            Remove sandbox <b>{sb.name}</b> (<code>{sb.id}</code>)?{' '}
            {running ? 'It is running: its processes end. ' : ''}Its files go; its ledger session and checkpoints stay.
          </p>
        </Confirm>
      ) : null}
    </span>
  );
}

// CreateDialog makes a sandbox from an image or an environment.
export function CreateDialog({ onClose, done, from }) {
  const { providers } = useSession();
  const [kind, setKind] = useState(from && from.environment ? 'environment' : 'image');
  const [image, setImage] = useState((from && from.image) || '');
  const [environment, setEnvironment] = useState((from && from.environment) || '');
  const [name, setName] = useState('');
  const [memory, setMemory] = useState('');
  const [cpu, setCpu] = useState('');
  const [disk, setDisk] = useState('');
  const [prov, setProv] = useState('');
  const a = useAction();
  const images = usePoll(() => get('/v0/images'), [], 0);
  const envs = usePoll(() => get('/v0/environments'), [], 0);
  const submit = async (e) => {
    e.preventDefault();
    const body = {};
    if (name) body.name = name;
    if (kind === 'environment') {
      body.environment = environment;
    } else {
      body.image = image;
      if (memory) body.memory = memory;
      if (cpu) body.cpu = cpu;
      if (disk) body.disk = disk;
      if (prov) body.provider = prov;
    }
    try {
      const sb = await a.run(() => post('/v0/sandboxes', body));
      notify('ok', `created ${sb.name}`);
      onClose();
      done(sb);
    } catch {
      // shown in the dialog
    }
  };
  const envList = (envs.data && envs.data.environments) || [];
  return (
    <Dialog title="New sandbox" onClose={onClose}>
      <form onSubmit={submit}>
        <div class="tabs" role="radiogroup">
          <label>
            <input type="radio" name="from" checked={kind === 'image'} onChange={() => setKind('image')} /> From an
            image
          </label>
          <label>
            <input type="radio" name="from" checked={kind === 'environment'} onChange={() => setKind('environment')} />{' '}
            From an environment
          </label>
        </div>
        {kind === 'image' ? (
          <>
            <Field label="Image" hint="A cached image, or a name to pull.">
              <input
                name="image"
                list="image-list"
                required
                value={image}
                onInput={(e) => setImage(e.currentTarget.value)}
                autocomplete="off"
              />
              <datalist id="image-list">
                {((images.data && images.data.images) || []).map((im) => (
                  <option key={im.ref} value={im.name} />
                ))}
              </datalist>
            </Field>
          </>
        ) : (
          <Field label="Environment">
            <select
              name="environment"
              required
              value={environment}
              onChange={(e) => setEnvironment(e.currentTarget.value)}
            >
              <option value="">{envList.length ? 'choose…' : 'no environments'}</option>
              {envList.map((en) => (
                <option key={en.name} value={en.name}>
                  {en.name} ({en.image})
                </option>
              ))}
            </select>
          </Field>
        )}
        <Field label="Name" hint="Empty: the sandbox's id.">
          <input name="name" value={name} onInput={(e) => setName(e.currentTarget.value)} autocomplete="off" />
        </Field>
        {kind === 'image' ? (
          <div class="row">
            <Field label="Memory">
              <input
                name="memory"
                placeholder="512MiB"
                value={memory}
                onInput={(e) => setMemory(e.currentTarget.value)}
              />
            </Field>
            <Field label="CPU">
              <input name="cpu" placeholder="1" value={cpu} onInput={(e) => setCpu(e.currentTarget.value)} />
            </Field>
            <Field label="Disk">
              <input name="disk" placeholder="default" value={disk} onInput={(e) => setDisk(e.currentTarget.value)} />
            </Field>
            <Field label="Provider">
              <select name="provider" value={prov} onChange={(e) => setProv(e.currentTarget.value)}>
                <option value="">default</option>
                {providers
                  .filter((p) => p.available)
                  .map((p) => (
                    <option key={p.name} value={p.name}>
                      {p.name}
                    </option>
                  ))}
              </select>
            </Field>
          </div>
        ) : null}
        <ErrorBox error={a.error} />
        <DialogButtons onClose={onClose} busy={a.busy} action="create-submit" label="Create" busyLabel="Creating…" />
      </form>
    </Dialog>
  );
}

// RestoreDialog starts a new sandbox from a checkpoint.
export function RestoreDialog({ cp, onClose, done }) {
  const [name, setName] = useState('');
  const a = useAction();
  const submit = async (e) => {
    e.preventDefault();
    try {
      const sb = await a.run(() => post(`/v0/checkpoints/${enc(cp.id)}/restore`, name ? { name } : {}));
      notify('ok', `restored ${cp.id} as ${sb.name}`);
      onClose();
      done(sb);
    } catch {
      // shown in the dialog
    }
  };
  return (
    <Dialog title={`Restore checkpoint ${cp.id}`} onClose={onClose}>
      <form onSubmit={submit}>
        <p class="muted">A new sandbox starts from the checkpoint's memory, processes and files.</p>
        <Field label="Name" hint="Empty: the new sandbox's id.">
          <input name="name" value={name} onInput={(e) => setName(e.currentTarget.value)} autocomplete="off" />
        </Field>
        <ErrorBox error={a.error} />
        <DialogButtons onClose={onClose} busy={a.busy} action="restore-submit" label="Restore" busyLabel="Restoring…" />
      </form>
    </Dialog>
  );
}
