package image

import (
	"crypto/tls"
	"net/http"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/useshards/shard/internal/errdefs"
)

// dockerHub is how docker spells Docker Hub in a full reference. go-containerregistry
// rewrites it to index.docker.io; we show the familiar spelling to users.
const dockerHub = "docker.io"

// idPattern matches an image ID or digest, or a prefix of one long enough
// (12 hex digits, like `docker images`) to be unlikely to be ambiguous.
var idPattern = regexp.MustCompile(`^(sha256:)?[0-9a-f]{12,64}$`)

// parseRef parses a user's image reference the way docker does:
// "python:3.12-slim" is index.docker.io/library/python:3.12-slim and a
// missing tag means ":latest". Registries named in Options.Insecure are
// parsed as insecure so that go-containerregistry also tries plain HTTP.
func (s *Store) parseRef(ref string) (name.Reference, error) {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return nil, errdefs.Invalid("image reference is empty")
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, errdefs.Invalid("invalid image reference %q: %s", ref, badNameReason(ref))
	}
	for _, c := range strings.Split(r.Context().RepositoryStr(), "/") {
		if !pathComponent.MatchString(c) {
			return nil, errdefs.Invalid("invalid image reference %q: %q is not a valid repository path component", ref, c)
		}
	}
	if s.insecure[r.Context().RegistryStr()] {
		if r, err = name.ParseReference(ref, name.Insecure); err != nil {
			return nil, errdefs.Invalid("invalid image reference %q: %s", ref, badNameReason(ref))
		}
	}
	return r, nil
}

// pathComponent is docker's grammar for one component of a repository
// path; go-containerregistry alone would accept "a/../b".
var pathComponent = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)

// badNameReason explains why a reference does not parse: ParseReference
// only says that it does not, the tag and digest parsers say why.
func badNameReason(ref string) string {
	var err error
	if strings.Contains(ref, "@") {
		_, err = name.NewDigest(ref)
	} else {
		_, err = name.NewTag(ref)
	}
	if err == nil {
		return "malformed"
	}
	return err.Error()
}

// refSep is ":" before a tag and "@" before a digest.
func refSep(r name.Reference) string {
	if _, ok := r.(name.Digest); ok {
		return "@"
	}
	return ":"
}

// registryName is the registry as users write it ("docker.io", not "index.docker.io").
func registryName(r name.Reference) string {
	reg := r.Context().RegistryStr()
	if reg == name.DefaultRegistry {
		return dockerHub
	}
	return reg
}

// canonical is the full reference as docker shows it, e.g.
// "docker.io/library/python:3.12-slim". It is the key of the ref index.
func canonical(r name.Reference) string {
	return registryName(r) + "/" + r.Context().RepositoryStr() + refSep(r) + r.Identifier()
}

// familiar is the short name docker users type: "python:3.12-slim",
// "user/img:latest", "127.0.0.1:5000/busybox:latest".
func familiar(r name.Reference) string {
	repo := r.Context().RepositoryStr()
	if registryName(r) != dockerHub {
		return r.Context().RegistryStr() + "/" + repo + refSep(r) + r.Identifier()
	}
	if short, ok := strings.CutPrefix(repo, "library/"); ok && !strings.Contains(short, "/") {
		repo = short
	}
	return repo + refSep(r) + r.Identifier()
}

// familiarOf turns a stored canonical key back into its familiar form.
func familiarOf(key string) string {
	_, key = splitKey(key)
	r, err := name.ParseReference(key)
	if err != nil {
		return key
	}
	return familiar(r)
}

// digestKey is the key under which an image stays reachable by digest
// (repo@sha256:...) once its tag has moved to another image.
func digestKey(key, digest string) string {
	p, canon := splitKey(key)
	r, err := name.ParseReference(canon)
	if err != nil {
		return ""
	}
	d := canonical(r.Context().Digest(digest))
	if p != "" {
		return importKey(p, d)
	}
	return d
}

// mirror is a Docker Hub mirror: a registry, optionally with a repository
// prefix (e.g. "harbor.local/dockerhub" serves library/python as
// dockerhub/library/python).
type mirror struct {
	raw    string
	reg    name.Registry
	prefix string
}

// parseMirror accepts "host[:port][/prefix]" with an optional scheme;
// "http://" marks the mirror as plain HTTP (insecure).
func parseMirror(raw string, insecure map[string]bool) (mirror, error) {
	rest := strings.TrimSpace(raw)
	scheme := ""
	if i := strings.Index(rest, "://"); i >= 0 {
		scheme, rest = strings.ToLower(rest[:i]), rest[i+3:]
	}
	if scheme != "" && scheme != "http" && scheme != "https" {
		return mirror{}, errdefs.Invalid("registry mirror %q: scheme must be http or https", raw)
	}
	host, prefix, _ := strings.Cut(strings.Trim(rest, "/"), "/")
	var opts []name.Option
	if scheme == "http" || insecure[host] {
		opts = append(opts, name.Insecure)
	}
	reg, err := name.NewRegistry(host, opts...)
	if err != nil || host == "" {
		return mirror{}, errdefs.Invalid("registry mirror %q is not a valid registry address", raw)
	}
	return mirror{raw: raw, reg: reg, prefix: prefix}, nil
}

// rebase points a Docker Hub reference at the mirror, same repository path.
func (m mirror) rebase(r name.Reference) name.Reference {
	repoPath := r.Context().RepositoryStr()
	if m.prefix != "" {
		repoPath = m.prefix + "/" + repoPath
	}
	repo := m.reg.Repo(repoPath)
	if d, ok := r.(name.Digest); ok {
		return repo.Digest(d.DigestStr())
	}
	return repo.Tag(r.Identifier())
}

// normalizeHost turns "http://host:port/" or "docker.io" into the registry
// name go-containerregistry uses, so Options.Insecure matches parsed refs.
func normalizeHost(h string) string {
	h = strings.TrimSpace(h)
	if i := strings.Index(h, "://"); i >= 0 {
		h = h[i+3:]
	}
	h = strings.TrimRight(h, "/")
	if h == dockerHub {
		h = name.DefaultRegistry
	}
	return h
}

// insecureTLS skips TLS verification, for registries the operator listed
// as insecure (self-signed certificates on a private registry).
func insecureTLS() *tls.Config {
	return &tls.Config{InsecureSkipVerify: true} //nolint:gosec // only for hosts the operator marked insecure
}

// transportFor picks the transport for a registry: every one is guarded
// (guard.go).
func (s *Store) transportFor(reg name.Registry) http.RoundTripper {
	skip := s.insecure[reg.RegistryStr()] || reg.Scheme() == "http"
	return limitedManifests{s.guard.transport(skip)}
}
