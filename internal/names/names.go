// Package names checks the names, tags, references and paths users give:
// each rule in one place, each refusal an errdefs invalid_argument (400)
// whose message says what is allowed.
package names

import (
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/useshards/shard/internal/errdefs"
)

// NameRule is the rule of sandbox, snapshot, environment and fork names,
// as a message says it.
const NameRule = "use letters, digits, '.', '_' and '-', starting with a letter or digit, at most 63"

var (
	nameRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)
	idRe   = regexp.MustCompile(`^[0-9a-f]{12}$`)
)

// Name checks the name of a sandbox, snapshot or environment (what says
// which in the message). It is a host name's worth of characters, never
// "." or "..", and never 12 hex digits, which is what ids look like.
func Name(what, s string) error {
	if what != "" {
		what += " "
	}
	if !nameRe.MatchString(s) {
		return errdefs.Invalid("%sname %s is not valid: %s", what, strconv.QuoteToASCII(short(s)), NameRule)
	}
	if idRe.MatchString(s) {
		return errdefs.Invalid("%sname %q looks like an id: choose a name that is not 12 hex digits", what, s)
	}
	return nil
}

// TagRule is the rule of checkpoint tags, as a message says it.
const TagRule = "use letters, digits, '_', '.' and '-', starting with a letter, digit or '_', at most 128 (like a docker tag)"

var tagRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// Tag checks a checkpoint's tag; "" is no tag.
func Tag(s string) error {
	if s != "" && !tagRe.MatchString(s) {
		return errdefs.Invalid("tag %s is not valid: %s", strconv.QuoteToASCII(short(s)), TagRule)
	}
	return nil
}

// pathComponent is docker's grammar for one component of a repository
// path: lower case letters and digits, separated by '.', '_', '__' or
// dashes. It has no room for "." or "..".
var pathComponent = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)

// hostLabel is one label of a DNS name.
var hostLabel = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)

// MaxRef bounds an image reference (docker's bound on a name is 255; a
// digest or tag after it adds at most ~130).
const MaxRef = 512

// ImageRef checks an image reference a user gives an image: it must parse
// as go-containerregistry parses references (docker's reading), its
// registry must be a host name or address with an optional port, and every
// component of its repository path must follow docker's grammar, so no
// component is "." or "..".
func ImageRef(ref string) error {
	bad := func(why string, args ...any) error {
		return errdefs.Invalid("image reference %s is not valid: %s; use e.g. myimage:1.0 or registry.example.com:5000/team/app:latest",
			strconv.QuoteToASCII(short(ref)), fmt.Sprintf(why, args...))
	}
	switch {
	case ref == "":
		return errdefs.Invalid("image reference is empty: use e.g. myimage:1.0")
	case len(ref) > MaxRef:
		return bad("it is %d bytes, at most %d", len(ref), MaxRef)
	case strings.TrimSpace(ref) != ref || strings.ContainsFunc(ref, func(r rune) bool { return r <= ' ' || r >= 0x7f }):
		return bad("it has spaces, control or non-ASCII characters")
	}
	for _, part := range strings.Split(strings.SplitN(ref, "@", 2)[0], "/") {
		if part == "." || part == ".." || part == "" {
			return bad("%q is not a path component", part)
		}
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return bad("%v", err)
	}
	if err := checkHost(r.Context().RegistryStr()); err != nil {
		return bad("registry %q: %v", r.Context().RegistryStr(), err)
	}
	for _, c := range strings.Split(r.Context().RepositoryStr(), "/") {
		if !pathComponent.MatchString(c) {
			return bad("%q is not a repository path component (lower case letters and digits, separated by '.', '_' or '-')", c)
		}
	}
	return nil
}

// checkHost checks a registry: host[:port], the host a DNS name, an IPv4
// address or a bracketed IPv6 one.
func checkHost(hostport string) error {
	host := hostport
	if h, port, err := net.SplitHostPort(hostport); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
			return errdefs.Invalid("port %q must be a number from 1 to 65535", port)
		}
		host = h
		if strings.Contains(host, ":") {
			if ip := net.ParseIP(host); ip != nil {
				return nil
			}
			return errdefs.Invalid("%q is not an address", host)
		}
	} else if strings.Contains(hostport, ":") {
		return errdefs.Invalid("not a host[:port]")
	}
	if net.ParseIP(host) != nil {
		return nil
	}
	if len(host) > 253 {
		return errdefs.Invalid("a host name is at most 253 characters")
	}
	for _, l := range strings.Split(host, ".") {
		if !hostLabel.MatchString(l) {
			return errdefs.Invalid("%q is not a host name label", l)
		}
	}
	return nil
}

var envNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// MaxEnvName bounds an environment variable's name.
const MaxEnvName = 255

// EnvName checks an environment variable's name: a letter or '_', then
// letters, digits and '_'.
func EnvName(s string) error {
	if !envNameRe.MatchString(s) || len(s) > MaxEnvName {
		return errdefs.Invalid("%s is not an environment variable name: use letters, digits and '_', not starting with a digit, at most %d", strconv.QuoteToASCII(short(s)), MaxEnvName)
	}
	return nil
}

// EnvVar checks a KEY=VALUE: a valid name, and a value without NUL (which
// no process environment can hold).
func EnvVar(kv string) error {
	k, v, ok := strings.Cut(kv, "=")
	if !ok {
		return errdefs.Invalid("env %s is not KEY=VALUE", strconv.QuoteToASCII(short(kv)))
	}
	if err := EnvName(k); err != nil {
		return errdefs.Invalid("env %s is not KEY=VALUE: %v", strconv.QuoteToASCII(short(kv)), err)
	}
	if strings.IndexByte(v, 0) >= 0 {
		return errdefs.Invalid("env %s: a value cannot hold a NUL byte", k)
	}
	return nil
}

// Path limits of Linux: PATH_MAX and NAME_MAX.
const (
	MaxPath     = 4095
	MaxPathPart = 255
)

// FilePath checks a path in a sandbox's file system that something is
// written to: absolute, clean (no "." or ".." components, no doubled or
// trailing slashes), not the root itself, without NUL or other control
// characters (Linux takes them, but a newline or an ESC in a path is a
// forged line or a terminal sequence wherever the path is shown), within
// Linux's path limits.
func FilePath(what, p string) error {
	q := strconv.QuoteToASCII(short(p))
	switch {
	case strings.IndexByte(p, 0) >= 0:
		return errdefs.Invalid("%s %s is not a path: it holds a NUL byte", what, q)
	case strings.ContainsFunc(p, unicode.IsControl):
		return errdefs.Invalid("%s %s holds a control character (a newline, a tab, an ESC, ...): name the file without one", what, q)
	case !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/":
		return errdefs.Invalid("%s %s must be a clean absolute path of a file, like /etc/app/key (no '.' or '..' components, no doubled or trailing '/')", what, q)
	case len(p) > MaxPath:
		return errdefs.Invalid("%s is %d bytes long: at most %d", what, len(p), MaxPath)
	}
	for _, c := range strings.Split(p[1:], "/") {
		if len(c) > MaxPathPart {
			return errdefs.Invalid("%s %s has a component of %d bytes: at most %d", what, q, len(c), MaxPathPart)
		}
	}
	return nil
}

// NoNUL checks a string that goes into a process's arguments, environment
// or path, none of which can hold a NUL byte.
func NoNUL(what, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return errdefs.Invalid("%s %s holds a NUL byte, which no argument, variable or path can", what, strconv.QuoteToASCII(short(s)))
	}
	return nil
}

// Port reads a TCP port: a number from 1 to 65535, written plainly.
func Port(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != s {
		return 0, errdefs.Invalid("port %s must be a number from 1 to 65535", strconv.QuoteToASCII(short(s)))
	}
	return n, nil
}

var printableRe = regexp.MustCompile(`^[\x21-\x7e]+$`)

// Token checks an opaque token a client chooses (an environment's
// fingerprint): printable ASCII without spaces, 1 to max characters.
func Token(what, s string, max int) error {
	if !printableRe.MatchString(s) || len(s) > max {
		return errdefs.Invalid("%s %s is not valid: use printable ASCII without spaces, at most %d characters", what, strconv.QuoteToASCII(short(s)), max)
	}
	return nil
}

// short cuts s for a message.
func short(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
