package ui

import (
	"bytes"
	"compress/gzip"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, method, target string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// assets are the files index.html loads.
func assets(t *testing.T) []string {
	t.Helper()
	index, err := fs.ReadFile(Files(), "index.html")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile(`(?:src|href)="/ui/([^"]+)"`).FindAllStringSubmatch(string(index), -1) {
		out = append(out, m[1])
	}
	if len(out) != 2 {
		t.Fatalf("index.html loads %v, want one script and one style sheet", out)
	}
	return out
}

func TestHandler(t *testing.T) {
	h := Handler()
	index, _ := fs.ReadFile(Files(), "index.html")
	js, css := "", ""
	for _, a := range assets(t) {
		switch {
		case strings.HasSuffix(a, ".js"):
			js = a
		case strings.HasSuffix(a, ".css"):
			css = a
		}
	}
	if js == "" || css == "" {
		t.Fatalf("index.html loads no script or no style sheet: %s", index)
	}
	jsBody, _ := fs.ReadFile(Files(), js)
	tests := []struct {
		name, method, path string
		status             int
		ctype, cache       string
		body               []byte
	}{
		{"root", "GET", "/ui/", 200, "text/html; charset=utf-8", "no-cache", index},
		{"index by name", "GET", "/ui/index.html", 200, "text/html; charset=utf-8", "no-cache", index},
		{"client route", "GET", "/ui/sandboxes/3f9a1c2b7d4e", 200, "text/html; charset=utf-8", "no-cache", index},
		{"deep client route", "GET", "/ui/tree/x/y?focus=1", 200, "text/html; charset=utf-8", "no-cache", index},
		{"dot-dot stays inside", "GET", "/ui/../../etc/passwd", 200, "text/html; charset=utf-8", "no-cache", index},
		{"script", "GET", "/ui/" + js, 200, "text/javascript; charset=utf-8", "public, max-age=31536000, immutable", jsBody},
		{"style", "GET", "/ui/" + css, 200, "text/css; charset=utf-8", "public, max-age=31536000, immutable", nil},
		{"head", "HEAD", "/ui/" + js, 200, "text/javascript; charset=utf-8", "public, max-age=31536000, immutable", []byte{}},
		{"missing asset", "GET", "/ui/assets/main-GONE.js", 404, "", "", nil},
		{"post", "POST", "/ui/", 405, "", "", nil},
		{"outside the prefix", "GET", "/other", 404, "", "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := get(t, h, tc.method, tc.path)
			if rec.Code != tc.status {
				t.Fatalf("%s %s: status %d, want %d", tc.method, tc.path, rec.Code, tc.status)
			}
			for k, v := range securityHeaders {
				if got := rec.Header().Get(k); got != v {
					t.Errorf("%s: got %q, want %q", k, got, v)
				}
			}
			if tc.ctype != "" {
				if got := rec.Header().Get("Content-Type"); got != tc.ctype {
					t.Errorf("Content-Type: got %q, want %q", got, tc.ctype)
				}
			}
			if tc.cache != "" {
				if got := rec.Header().Get("Cache-Control"); got != tc.cache {
					t.Errorf("Cache-Control: got %q, want %q", got, tc.cache)
				}
			}
			if tc.body != nil && !bytes.Equal(rec.Body.Bytes(), tc.body) {
				t.Errorf("body: got %d bytes, want %d", rec.Body.Len(), len(tc.body))
			}
		})
	}
}

// TestRevalidate: index.html is revalidated on every load, and answered
// 304 while it did not change.
func TestRevalidate(t *testing.T) {
	h := Handler()
	first := get(t, h, "GET", "/ui/")
	etag := first.Header().Get("ETag")
	if etag == "" {
		t.Fatal("no ETag on index.html")
	}
	again := get(t, h, "GET", "/ui/sandboxes", "If-None-Match", etag)
	if again.Code != http.StatusNotModified {
		t.Fatalf("revalidation with the ETag: status %d, want 304", again.Code)
	}
}

// TestNoInlineScript: the CSP allows only the console's own script files,
// so index.html must hold no inline script (it would not run).
func TestNoInlineScript(t *testing.T) {
	index, _ := fs.ReadFile(Files(), "index.html")
	for _, m := range regexp.MustCompile(`<script[^>]*>`).FindAllString(string(index), -1) {
		if !strings.Contains(m, " src=") {
			t.Errorf("inline script in index.html: %s", m)
		}
	}
	if bytes.Contains(index, []byte("style=")) {
		t.Errorf("index.html has a style attribute")
	}
}

// The bundle goes gzipped to a browser that takes it, whole to one that
// does not, with an ETag of its own per form.
func TestGzip(t *testing.T) {
	h := Handler()
	for _, a := range assets(t) {
		raw, err := fs.ReadFile(Files(), a)
		if err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			accept string
			gz     bool
		}{
			{"gzip, deflate, br, zstd", true},
			{"br;q=1.0, gzip;q=0.8", true},
			{"", false},
			{"br", false},
			{"gzip;q=0", false},
		}
		for _, tt := range tests {
			rec := get(t, h, "GET", "/ui/"+a, "Accept-Encoding", tt.accept)
			body := rec.Body.Bytes()
			if gz := rec.Header().Get("Content-Encoding") == "gzip"; gz != tt.gz {
				t.Errorf("%s with Accept-Encoding %q: gzipped %v, want %v", a, tt.accept, gz, tt.gz)
				continue
			}
			if tt.gz {
				zr, err := gzip.NewReader(bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				if body, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
				if !strings.HasSuffix(rec.Header().Get("ETag"), `-gz"`) {
					t.Errorf("%s gzipped has the ETag %s of the whole file", a, rec.Header().Get("ETag"))
				}
			}
			if !bytes.Equal(body, raw) {
				t.Errorf("%s with Accept-Encoding %q: not the file's bytes", a, tt.accept)
			}
			if rec.Header().Get("Vary") != "Accept-Encoding" {
				t.Errorf("%s: Vary %q", a, rec.Header().Get("Vary"))
			}
		}
	}
}

// TestCSP: the console's policy runs no inline or evaluated script, is
// never framed, and closes what default-src leaves open (<base>, where
// forms submit).
func TestCSP(t *testing.T) {
	csp := securityHeaders["Content-Security-Policy"]
	directives := map[string]string{}
	for _, d := range strings.Split(csp, ";") {
		name, value, _ := strings.Cut(strings.TrimSpace(d), " ")
		directives[name] = value
	}
	for name, want := range map[string]string{
		"default-src":     "'self'",
		"frame-ancestors": "'none'",
		"base-uri":        "'none'",
		"form-action":     "'none'",
	} {
		if directives[name] != want {
			t.Errorf("%s is %q, want %q (CSP %q)", name, directives[name], want, csp)
		}
	}
	if _, ok := directives["script-src"]; ok || strings.Contains(csp, "unsafe-eval") {
		t.Errorf("the CSP loosens scripts: %q", csp)
	}
}
