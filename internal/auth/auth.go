// Package auth is who may do what: API keys (scoped tokens, of which only a
// hash is stored), the scopes every endpoint declares, and the rule that a
// connection on the server's root-only Unix socket is the administrator.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

// Scopes. A scope "x:*" covers every "x:..." scope; "*" covers all.
const (
	SandboxRead  = "sandbox:read"  // list, inspect, ledger, checkpoints, snapshots, images
	SandboxWrite = "sandbox:write" // create, exec, stop, start, remove, fork, checkpoint, restore, ports
	SecretRead   = "secret:read"   // list secret names
	SecretWrite  = "secret:write"  // set and remove secrets; grant and ungrant
	SecretAll    = "secret:*"
	PolicyRead   = "policy:read" // show a sandbox's network policy
	PolicyWrite  = "policy:write"
	PolicyAll    = "policy:*"
	TokenRead    = "token:read"  // list tokens
	TokenWrite   = "token:write" // create and revoke tokens
	TokenAll     = "token:*"
	MetricsRead  = "metrics:read" // scrape GET /metrics
	All          = "*"
	None         = ""    // an endpoint anyone may call (version, the OpenAPI document)
	AnyKey       = "key" // an endpoint any valid key may call, whatever its scopes (whoami); never held
)

// Known lists every scope a token may hold.
var Known = []string{SandboxRead, SandboxWrite, "sandbox:*", SecretRead, SecretWrite, SecretAll,
	PolicyRead, PolicyWrite, PolicyAll, TokenRead, TokenWrite, TokenAll, MetricsRead, All}

// Valid reports whether s is a scope a token may hold.
func Valid(s string) bool { return slices.Contains(Known, s) }

// Covers reports whether granted scopes allow need.
func Covers(granted []string, need string) bool {
	if need == None || need == AnyKey {
		return true
	}
	for _, g := range granted {
		if g == All || g == need {
			return true
		}
		if area, ok := strings.CutSuffix(g, ":*"); ok && strings.HasPrefix(need, area+":") {
			return true
		}
	}
	return false
}

// Key prefix: a key is "shk_<id>_<secret>", so a leaked one is easy to spot
// (and to grep for) and its id finds its record without the secret.
const keyPrefix = "shk_"

// NewKey makes a token id and its key. Only Hash(key's secret) is kept.
func NewKey() (id, key string) {
	id = randomHex(6)
	return id, keyPrefix + id + "_" + randomHex(24)
}

// ParseKey splits a key into its id and secret.
func ParseKey(key string) (id, secret string, ok bool) {
	rest, ok := strings.CutPrefix(key, keyPrefix)
	if !ok {
		return "", "", false
	}
	id, secret, ok = strings.Cut(rest, "_")
	return id, secret, ok && len(id) == 12 && len(secret) == 48
}

// Hash is what is stored of a key's secret.
func Hash(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// Matches compares a secret with a stored hash in constant time.
func Matches(hash, secret string) bool {
	return subtle.ConstantTimeCompare([]byte(hash), []byte(Hash(secret))) == 1
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Principal is who makes a request. Every request has one, never nil
// (Tailscale's ipnauth.Actor habit): the Unix socket's (Socket), a key's,
// or, on a route anyone may call, Anonymous. What a principal may do is
// what it says, never what a missing one is taken to mean.
type Principal struct {
	Admin   bool // the Unix socket: everything
	TokenID string
	Name    string
	Scopes  []string
	// Project is the one project the key acts in, or store.AllProjects
	// ("*") for a key of every project (the administrator's). A principal
	// of neither acts in no project (ProjectFor refuses it).
	Project string
}

// Anonymous is the principal of a request that carries no key, on a route
// anyone may call (auth.None: the version, the OpenAPI document): no
// scope, no project, not the administrator.
var Anonymous = &Principal{Name: "anonymous"}

// Socket is the principal of a connection on the server's Unix socket,
// which only root can reach: the administrator, of every project.
var Socket = &Principal{Admin: true, Name: "the local administrator", Project: store.AllProjects}

// AllProjects reports whether p may act in every project (and choose one
// per request); a project's key acts in its own only.
func (p *Principal) AllProjects() bool { return p.Admin || p.Project == store.AllProjects }

// ProjectFor returns the project a request of p acts in: the one it asked
// for (want; "" is the default project) if p may act there. A principal of
// no project (Anonymous, or a key whose project is not a project's name)
// may act in none.
func (p *Principal) ProjectFor(want string) (string, error) {
	if !p.AllProjects() && project.Check(p.Project) != nil {
		return "", errdefs.New(errdefs.KindForbidden, client.CodeNoProject, "%s belongs to no project: it cannot act in one (a key of a project can: shard token create --project NAME)", p.Name)
	}
	if want == "" {
		if p.AllProjects() {
			return project.Default, nil
		}
		return p.Project, nil
	}
	if err := project.Check(want); err != nil { // before it is echoed in a message
		return "", err
	}
	if p.AllProjects() {
		return want, nil
	}
	if want != p.Project {
		return "", errdefs.New(errdefs.KindForbidden, client.CodeWrongProject, "token %s belongs to project %s: it cannot act in project %s", p.Name, p.Project, want)
	}
	return p.Project, nil
}

// Can reports whether p may do what needs scope. Anonymous may do only
// what needs none.
func (p *Principal) Can(scope string) bool {
	switch {
	case scope == None:
		return true
	case p == Anonymous:
		return false
	}
	return p.Admin || Covers(p.Scopes, scope)
}

// Need returns a forbidden error naming the scope p lacks, or nil; for
// Anonymous, an unauthenticated one (what it lacks is a key).
func (p *Principal) Need(scopes ...string) error {
	for _, s := range scopes {
		if p.Can(s) {
			continue
		}
		if p == Anonymous {
			return errdefs.New(errdefs.KindUnauth, client.CodeUnauthenticated, "this endpoint needs an API key: send Authorization: Bearer <key> (the SDKs and the CLI send SHARD_API_KEY)")
		}
		return errdefs.Wrap(errdefs.KindForbidden, client.CodeMissingScope, &MissingScope{Scope: s, Token: p.Name})
	}
	return nil
}

// MissingScope is the error of a request its token does not allow.
type MissingScope struct{ Scope, Token string }

func (e *MissingScope) Error() string {
	return fmt.Sprintf("token %s lacks the scope %s: create a token that has it (shard token create --scope %s)", e.Token, e.Scope, e.Scope)
}

type ctxKey struct{}

// WithPrincipal returns ctx carrying p (nil is Anonymous).
func WithPrincipal(ctx context.Context, p *Principal) context.Context {
	if p == nil {
		p = Anonymous
	}
	return context.WithValue(ctx, ctxKey{}, p)
}

// From returns the principal ctx carries: Anonymous if none, never nil.
func From(ctx context.Context) *Principal {
	p, _ := Lookup(ctx)
	return p
}

// Lookup returns the principal ctx carries and whether it carries one
// (Anonymous, and false, if not): the guard asks for a key only then.
func Lookup(ctx context.Context) (*Principal, bool) {
	if p, _ := ctx.Value(ctxKey{}).(*Principal); p != nil {
		return p, true
	}
	return Anonymous, false
}
