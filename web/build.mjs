// Builds the console into internal/ui/dist (or the directory given as
// --outdir=DIR): index.html, and one JS and one CSS file named by their
// content's hash, so the server may let browsers keep them for ever.
// esbuild is deterministic: the same source gives the same bytes, which
// internal/ui's drift test checks against the committed dist.
import * as esbuild from 'esbuild';
import { readFileSync, writeFileSync, rmSync, mkdirSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const arg = process.argv.find((a) => a.startsWith('--outdir='));
const out = resolve(arg ? arg.slice('--outdir='.length) : join(here, '..', 'internal', 'ui', 'dist'));

rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });

const result = await esbuild.build({
  absWorkingDir: here,
  entryPoints: ['src/main.jsx'],
  bundle: true,
  minify: true,
  format: 'iife',
  target: ['chrome100', 'firefox100', 'safari15'],
  jsx: 'automatic',
  jsxImportSource: 'preact',
  outdir: join(out, 'assets'),
  entryNames: '[name]-[hash]',
  legalComments: 'eof',
  metafile: true,
  logLevel: 'warning',
});

let js = '';
let css = '';
for (const file of Object.keys(result.metafile.outputs)) {
  if (file.endsWith('.js')) js = 'assets/' + basename(file);
  if (file.endsWith('.css')) css = 'assets/' + basename(file);
}
if (!js || !css) throw new Error('esbuild made no JS or no CSS');
const html = readFileSync(join(here, 'src', 'index.html'), 'utf8')
  .replace('{{js}}', js)
  .replace('{{css}}', css);
writeFileSync(join(out, 'index.html'), html);
console.log(`built ${out}: ${js}, ${css}`);
