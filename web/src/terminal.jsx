// An exec with a TTY in the browser: xterm.js over the WebSocket exec
// (GET /v0/sandboxes/{id}/exec, binary messages of one type byte and a
// payload; see internal/api/exec.go).
import { useEffect, useRef, useState } from 'preact/hooks';
import { Terminal as XTerm } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import '@xterm/xterm/css/xterm.css';
import { execURL, execProtocols, get, enc } from './api.js';

const STDIN = 0x49; // 'I'
const RESIZE = 0x52; // 'R'
const SIGNAL = 0x4b; // 'K'
const STARTED = 0x53; // 'S'
const STDOUT = 0x4f; // 'O'
const STDERR = 0x45; // 'E'
const EXIT = 0x58; // 'X'

const SIGHUP = 1;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function frame(type, payload) {
  const out = new Uint8Array(payload.length + 1);
  out[0] = type;
  out.set(payload, 1);
  return out;
}

function json(type, v) {
  return frame(type, encoder.encode(JSON.stringify(v)));
}

export function Terminal({ id, argv }) {
  const box = useRef();
  const [status, setStatus] = useState('connecting…');
  const [failed, setFailed] = useState(false);
  useEffect(() => {
    const term = new XTerm({
      cursorBlink: true,
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
      fontSize: 13,
      scrollback: 5000,
      theme: { background: '#1b1e23' },
    });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(box.current);
    try {
      fit.fit();
    } catch {
      // not laid out yet: the observer below fits it
    }
    const req = { argv, tty: true, interactive: true, rows: term.rows, cols: term.cols };
    const ws = new WebSocket(execURL(id, req), execProtocols());
    ws.binaryType = 'arraybuffer';
    let started = false;
    let exited = false;
    const send = (b) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(b);
    };
    ws.onmessage = (e) => {
      const b = new Uint8Array(e.data);
      if (!b.length) return;
      const p = b.subarray(1);
      switch (b[0]) {
        case STARTED: {
          started = true;
          const s = JSON.parse(decoder.decode(p));
          setStatus(`running ${argv.join(' ')} (pid ${s.pid})`);
          term.focus();
          break;
        }
        case STDOUT:
        case STDERR:
          term.write(p);
          break;
        case EXIT: {
          exited = true;
          const x = JSON.parse(decoder.decode(p));
          let s = x.error ? `failed: ${x.error}` : `exited with code ${x.exit_code}`;
          if (x.signal) s += ` (signal ${x.signal})`;
          if (x.oom_killed) s += ', killed for memory';
          setStatus(s);
          break;
        }
      }
    };
    ws.onclose = async (e) => {
      if (exited) return;
      if (started) {
        setStatus(e.reason ? `closed: ${e.reason}` : 'closed');
        return;
      }
      // An exec refused before the upgrade answers JSON that a browser's
      // WebSocket does not show: ask the sandbox why.
      setFailed(true);
      let why = 'the exec did not start';
      try {
        const sb = await get(`/v0/sandboxes/${enc(id)}`);
        if (sb.state !== 'running') why += `: the sandbox is ${sb.state}`;
        else why += ' (is the command in the image?)';
      } catch (err) {
        why += ': ' + err.message;
      }
      setStatus(why);
    };
    const d1 = term.onData((s) => send(frame(STDIN, encoder.encode(s))));
    const d2 = term.onBinary((s) =>
      send(
        frame(
          STDIN,
          Uint8Array.from(s, (c) => c.charCodeAt(0) & 0xff),
        ),
      ),
    );
    const d3 = term.onResize(({ rows, cols }) => send(json(RESIZE, { rows, cols })));
    const ro = new ResizeObserver(() => {
      try {
        fit.fit();
      } catch {
        // hidden
      }
    });
    ro.observe(box.current);
    return () => {
      ro.disconnect();
      d1.dispose();
      d2.dispose();
      d3.dispose();
      // Closing the WebSocket alone leaves the command running: hang it up.
      if (!exited) send(json(SIGNAL, { signal: SIGHUP }));
      ws.close(1000);
      term.dispose();
    };
  }, [id]);
  return (
    <div class="terminal-wrap">
      <div class={'term-status small ' + (failed ? 'err-text' : 'muted')} id="term-status">
        {status}
      </div>
      <div class="terminal" ref={box} id="terminal" />
    </div>
  );
}
