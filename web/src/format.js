// Plain text for numbers, sizes and times as an operator reads them.

export function bytes(n) {
  if (n === undefined || n === null) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0;
  let v = n;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  if (i === 0) return `${n} B`;
  return `${v >= 100 || Number.isInteger(v) ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`;
}

export function cpu(c) {
  if (c === undefined || c === null) return '';
  return String(Math.round(c * 1000) / 1000);
}

export function ms(d) {
  if (d === undefined || d === null) return '';
  if (d < 1000) return `${d} ms`;
  if (d < 60000) return `${(d / 1000).toFixed(d < 10000 ? 2 : 1)} s`;
  const m = Math.floor(d / 60000);
  return `${m}m${Math.round((d % 60000) / 1000)}s`;
}

function pad(n) {
  return String(n).padStart(2, '0');
}

// time is local time, with the date only when it is not today.
export function time(iso) {
  if (!iso) return '';
  const t = new Date(iso);
  if (isNaN(t)) return iso;
  const now = new Date();
  const hms = `${pad(t.getHours())}:${pad(t.getMinutes())}:${pad(t.getSeconds())}`;
  if (t.toDateString() === now.toDateString()) return hms;
  return `${t.getFullYear()}-${pad(t.getMonth() + 1)}-${pad(t.getDate())} ${hms}`;
}

export function ago(iso) {
  if (!iso) return '';
  const s = Math.round((Date.now() - new Date(iso)) / 1000);
  if (s < 60) return `${Math.max(s, 0)}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

export function short(digest) {
  if (!digest) return '';
  const [algo, hex] = digest.includes(':') ? digest.split(':', 2) : ['', digest];
  return (algo ? algo + ':' : '') + hex.slice(0, 12);
}

// argv shows a command as a shell would take it back: words quoted only
// when they need it. The text is rendered as text, never as markup.
export function argv(a) {
  if (!Array.isArray(a)) return '';
  return a
    .map((w) => {
      const s = String(w);
      if (s !== '' && /^[A-Za-z0-9_@%+=:,./-]+$/.test(s)) return s;
      return "'" + s.replace(/'/g, `'"'"'`) + "'";
    })
    .join(' ');
}
