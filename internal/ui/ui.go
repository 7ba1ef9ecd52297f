// Package ui serves shard's web console: the static files that web/ builds
// into dist, embedded in the binary so the console needs nothing but
// `shard serve` (no CDN, no second process). The files hold nothing
// secret; every datum the console shows comes through /v0 with the
// user's API key.
package ui

import (
	"bytes"
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
	files := Files()
	index, err := fs.ReadFile(files, "index.html")
	if err != nil {
		panic("ui: dist/index.html is missing: run npm run build in web/")
	}
	// Each file's ETag, so a revalidated index.html is a 304.
	etags := map[string]string{}
	fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := fs.ReadFile(files, p)
			sum := sha256.Sum256(b)
			etags[p] = `"` + hex.EncodeToString(sum[:8]) + `"`
		}
		return nil
	})
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
			if b, err := fs.ReadFile(files, name); err == nil {
				serve(w, r, name, etags[name], b, "public, max-age=31536000, immutable")
				return
			}
			// A missing asset is an old page asking for what a new
			// binary no longer has: a 404, not index.html as script.
			if strings.HasPrefix(name, "assets/") {
				http.NotFound(w, r)
				return
			}
		}
		serve(w, r, "index.html", etags["index.html"], index, "no-cache")
	})
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

func serve(w http.ResponseWriter, r *http.Request, name, etag string, b []byte, cache string) {
	ctype, ok := types[path.Ext(name)]
	if !ok {
		ctype = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("Cache-Control", cache)
	if etag != "" {
		w.Header().Set("ETag", etag)
	}
	http.ServeContent(w, r, name, epoch, bytes.NewReader(b))
}
