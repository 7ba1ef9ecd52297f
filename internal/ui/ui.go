// Package ui serves shard's web console: the static files that web/ builds
// into dist, embedded in the binary so the console needs nothing but
// `shard serve` (no CDN, no second process). The files hold nothing
// secret; every datum the console shows comes through /v0 with the
// user's API key.
package ui

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed all:dist
var dist embed.FS

// Prefix is where the console is mounted.
const Prefix = "/ui/"

// Security headers on every answer: the console runs only its own script,
// talks only to its own origin (the WebSocket exec included: 'self' covers
// ws: to the same host), and is never framed; no <base> and no form
// submission (its forms are handled by script), which default-src does not
// cover.
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
	"X-Content-Type-Options":  "nosniff",
	"Referrer-Policy":         "no-referrer",
}

// Files returns the built console (index.html and assets/), for tests.
func Files() fs.FS {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	return sub
}

// Handler serves the console under Prefix. A path that names a file gets
// it; any other path gets index.html, so the console's own routes
// (/ui/sandboxes/ID) survive a reload. Assets are named by their content's
// hash and cached for a year; index.html is revalidated every time, so a
// new binary's console is picked up at once.
func Handler() http.Handler {
	all := map[string]*file{}
	fs.WalkDir(Files(), ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := fs.ReadFile(Files(), p)
			all[p] = newFile(b)
		}
		return nil
	})
	index := all["index.html"]
	if index == nil {
		panic("ui: dist/index.html is missing: run npm run build in web/")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range securityHeaders {
			w.Header().Set(k, v)
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		name, ok := strings.CutPrefix(r.URL.Path, Prefix)
		if !ok {
			http.NotFound(w, r)
			return
		}
		name = strings.TrimPrefix(path.Clean("/"+name), "/")
		if name != "" && name != "index.html" {
			if f := all[name]; f != nil {
				f.serve(w, r, name, "public, max-age=31536000, immutable")
				return
			}
			// A missing asset is an old page asking for what a new
			// binary no longer has: a 404, not index.html as script.
			if strings.HasPrefix(name, "assets/") {
				http.NotFound(w, r)
				return
			}
		}
		index.serve(w, r, "index.html", "no-cache")
	})
}

// file is one of the console's files, with its ETag (so a revalidated
// index.html is a 304) and, when it is worth it, its gzip form: the
// bundle goes over the wire at a quarter of its size (410 KB to 110 KB),
// compressed once when the server starts.
type file struct {
	b, gz          []byte
	etag, gzipETag string
}

func newFile(b []byte) *file {
	sum := sha256.Sum256(b)
	f := &file{b: b, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
	if len(b) >= 1024 {
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		zw.Write(b)
		zw.Close()
		if buf.Len() < len(b) {
			f.gz, f.gzipETag = buf.Bytes(), `"`+hex.EncodeToString(sum[:8])+`-gz"`
		}
	}
	return f
}

// types are the console's files' media types, fixed here rather than read
// from the host's mime.types, which may name JavaScript otherwise.
var types = map[string]string{
	".html":  "text/html; charset=utf-8",
	".js":    "text/javascript; charset=utf-8",
	".css":   "text/css; charset=utf-8",
	".svg":   "image/svg+xml",
	".png":   "image/png",
	".json":  "application/json",
	".txt":   "text/plain; charset=utf-8",
	".woff2": "font/woff2",
}

// epoch is the modification time embedded files report (none): ETags, and
// content hashes in the assets' names, do the caching.
var epoch time.Time

func (f *file) serve(w http.ResponseWriter, r *http.Request, name, cache string) {
	ctype, ok := types[path.Ext(name)]
	if !ok {
		ctype = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("Cache-Control", cache)
	b, etag := f.b, f.etag
	if f.gz != nil {
		w.Header().Set("Vary", "Accept-Encoding")
		if acceptsGzip(r) {
			b, etag = f.gz, f.gzipETag
			w.Header().Set("Content-Encoding", "gzip")
		}
	}
	w.Header().Set("ETag", etag)
	http.ServeContent(w, r, name, epoch, bytes.NewReader(b))
}

// acceptsGzip reads Accept-Encoding as browsers send it ("gzip, deflate,
// br, zstd"); a gzip with q=0 is a refusal.
func acceptsGzip(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept-Encoding") {
		for _, part := range strings.Split(v, ",") {
			enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			if strings.EqualFold(strings.TrimSpace(enc), "gzip") {
				q := strings.ReplaceAll(params, " ", "")
				return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
			}
		}
	}
	return false
}
