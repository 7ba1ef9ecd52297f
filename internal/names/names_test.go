package names

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/useshards/shard/internal/errdefs"
)

// check fails t unless err is nil (want "") or an invalid_argument whose
// message holds want.
func check(t *testing.T, call string, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("%s = %v, want nil", call, err)
	case want != "" && err == nil:
		t.Errorf("%s = nil, want an error saying %q", call, want)
	case want != "" && (errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), want)):
		t.Errorf("%s = %v (kind %s), want invalid_argument saying %q", call, err, errdefs.KindOf(err), want)
	}
}

func TestName(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"base", ""}, {"try-1", ""}, {"a.b_c", ""}, {strings.Repeat("a", 63), ""}, {"A9", ""},
		{"", "not valid"}, {".", "not valid"}, {"..", "not valid"}, {"../x", "not valid"}, {"-a", "not valid"},
		{"a/b", "not valid"}, {"a\x00", "not valid"}, {strings.Repeat("a", 64), "at most 63"}, {"a b", "not valid"},
		{"a\n", "not valid"}, {"é", "not valid"}, {"0123456789ab", "looks like an id"},
	} {
		check(t, "Name("+tt.in+")", Name("sandbox", tt.in), tt.want)
	}
}

func TestTag(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"", ""}, {"deps", ""}, {"v1.2-rc_3", ""}, {"_x", ""}, {strings.Repeat("t", 128), ""},
		// Old code took all of these as they were.
		{"a/b", "not valid"}, {"../../x", "not valid"}, {"a\x00b", "not valid"}, {strings.Repeat("t", 129), "at most 128"},
		{strings.Repeat("t", 300), "at most 128"}, {".hidden", "not valid"}, {"-x", "not valid"}, {"a b", "not valid"},
		{"tab\t", "not valid"}, {"ünï", "not valid"}, {"v1\x1b[31m", "not valid"}, {"v1\nck-forged", "not valid"}, {"x\u202e", "not valid"},
	} {
		check(t, "Tag("+tt.in+")", Tag(tt.in), tt.want)
	}
}

func TestImageRef(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"busybox", ""}, {"busybox:1.36", ""}, {"python:3.12-slim", ""}, {"library/python", ""},
		{"127.0.0.1:5000/busybox:latest", ""}, {"localhost:5000/a/b/c:v1", ""}, {"registry.example.com/team/app", ""},
		{"[::1]:5000/img:1", ""}, {"docker.io/library/busybox@sha256:" + strings.Repeat("a", 64), ""},
		{"my-reg.example.com/x__y/z-w.v:tag_1", ""},
		{"", "empty"}, {"../x", "not a path component"}, {"a/../b", "not a path component"}, {"./x", "not a path component"},
		{"x/..", "not a path component"}, {"/x", "not a path component"}, {"x//y", "not a path component"},
		{"..:5000/x", "not a host name label"}, {"a..b.com/x", "not a host name label"}, {"reg.com:0/x", "port"},
		{"reg.com:99999/x", "port"}, {"UPPER", "not valid"}, {"x:", "not valid"}, {"x y", "spaces"}, {"x\x00", "control"},
		{"x\n", "spaces"}, {"ïmage", "non-ASCII"}, {"a/" + strings.Repeat("b", MaxRef), "at most"}, {"x:a/b", "not valid"},
		{"x@sha256:zz", "not valid"}, {"-x", "not valid"}, {"x-", "not a repository path component"},
	} {
		check(t, "ImageRef("+tt.in+")", ImageRef(tt.in), tt.want)
	}
}

func TestEnv(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"PATH", ""}, {"_x1", ""}, {"GH_TOKEN", ""},
		{"", "not an environment variable name"}, {"1X", "not an environment"}, {"A=B", "not an environment"},
		{"A-B", "not an environment"}, {"A\x00", "not an environment"}, {strings.Repeat("A", 256), "at most 255"},
	} {
		check(t, "EnvName("+tt.in+")", EnvName(tt.in), tt.want)
	}
	for _, tt := range []struct{ in, want string }{
		{"A=1", ""}, {"A=", ""}, {"A=b=c", ""}, {"A=multi\nline", ""},
		{"A", "not KEY=VALUE"}, {"=1", "not KEY=VALUE"}, {"1A=x", "not KEY=VALUE"}, {"A=\x00", "NUL"},
	} {
		check(t, "EnvVar("+tt.in+")", EnvVar(tt.in), tt.want)
	}
}

func TestFilePath(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"/etc/app/key", ""}, {"/k", ""}, {"/a/" + strings.Repeat("b", 255), ""},
		{"", "clean absolute"}, {"/", "clean absolute"}, {"rel/x", "clean absolute"}, {"/a/../b", "clean absolute"},
		{"/a/./b", "clean absolute"}, {"/a//b", "clean absolute"}, {"/a/", "clean absolute"}, {"/a\x00b", "NUL"},
		{"/a\nb", "control character"}, {"/a\x1b[31mb", "control character"}, {"/a\tb", "control character"}, {"/a\u0085b", "control character"}, {"/a\x7f", "control character"},
		{"/tmp/clé 日本/ü b", ""},
		{"/a/" + strings.Repeat("b", 256), "component"}, {strings.Repeat("/abc", 1100), "at most 4095"},
	} {
		check(t, "FilePath("+tt.in+")", FilePath("file", tt.in), tt.want)
	}
}

func TestPort(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int
	}{{"1", 1}, {"80", 80}, {"65535", 65535}, {"0", 0}, {"65536", 0}, {"-1", 0}, {"+80", 0}, {"080", 0}, {"8o", 0}, {"", 0}, {"99999999999999999999", 0}} {
		got, err := Port(tt.in)
		if got != tt.want || (err == nil) != (tt.want != 0) {
			t.Errorf("Port(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
		if err != nil && errdefs.KindOf(err) != errdefs.KindInvalid {
			t.Errorf("Port(%q) error kind %s, want invalid", tt.in, errdefs.KindOf(err))
		}
	}
}

func TestTokenAndNoNUL(t *testing.T) {
	check(t, "Token(py-abc)", Token("fingerprint", "py-"+strings.Repeat("a", 64), 128), "")
	check(t, "Token()", Token("fingerprint", "", 128), "printable")
	check(t, "Token(space)", Token("fingerprint", "a b", 128), "printable")
	check(t, "Token(long)", Token("fingerprint", strings.Repeat("a", 129), 128), "at most 128")
	check(t, "NoNUL(ok)", NoNUL("argv", "sh -c 'echo\n'"), "")
	check(t, "NoNUL(nul)", NoNUL("argv", "a\x00b"), "NUL")
}

// invalid fails t unless err is nil or a 400.
func invalid(t *testing.T, call string, err error) {
	t.Helper()
	if err != nil && errdefs.KindOf(err) != errdefs.KindInvalid {
		t.Fatalf("%s = %v: kind %s, want invalid_argument", call, err, errdefs.KindOf(err))
	}
	if err != nil && !utf8.ValidString(err.Error()) {
		t.Fatalf("%s: message %q is not UTF-8", call, err)
	}
}

// FuzzNames runs every checker on the same input: none panics, each
// refusal is a 400 with a UTF-8 message, and what passes has the
// properties the rules promise.
func FuzzNames(f *testing.F) {
	for _, s := range []string{"base", "../x", "a/b", "0123456789ab", "t\x00", "/etc/app/key", "/a/../b", "python:3.12-slim",
		"..:5000/x", "127.0.0.1:5000/busybox", "[::1]:5000/img", "A=B", "65535", "080", strings.Repeat("x", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if err := Name("sandbox", s); err == nil {
			if len(s) > 63 || strings.ContainsAny(s, "/\x00 ") || s == "." || s == ".." {
				t.Fatalf("Name(%q) passed", s)
			}
		} else {
			invalid(t, "Name", err)
		}
		if err := Tag(s); err == nil {
			if len(s) > 128 || strings.ContainsAny(s, "/\x00 ") || (s != "" && s[0] == '.') {
				t.Fatalf("Tag(%q) passed", s)
			}
		} else {
			invalid(t, "Tag", err)
		}
		if err := ImageRef(s); err == nil {
			for _, c := range strings.Split(s, "/") {
				if c == ".." || c == "." || c == "" {
					t.Fatalf("ImageRef(%q) passed with a component %q", s, c)
				}
			}
		} else {
			invalid(t, "ImageRef", err)
		}
		if err := FilePath("file", s); err == nil {
			if filepath.Clean(s) != s || !filepath.IsAbs(s) || strings.ContainsFunc(s, unicode.IsControl) || s == "/" {
				t.Fatalf("FilePath(%q) passed", s)
			}
		} else {
			invalid(t, "FilePath", err)
		}
		if err := EnvVar(s); err == nil {
			if k, _, _ := strings.Cut(s, "="); strings.ContainsAny(k, "=\x00") || k == "" || strings.Contains(s, "\x00") {
				t.Fatalf("EnvVar(%q) passed", s)
			}
		} else {
			invalid(t, "EnvVar", err)
		}
		if p, err := Port(s); err == nil {
			if p < 1 || p > 65535 {
				t.Fatalf("Port(%q) = %d", s, p)
			}
			// A port passed is a path segment as it is.
			if r, _ := http.NewRequest("GET", "http://x/"+s, nil); r == nil || r.URL.Path != "/"+s {
				t.Fatalf("Port(%q) passed but is no plain path segment", s)
			}
		} else {
			invalid(t, "Port", err)
		}
	})
}
