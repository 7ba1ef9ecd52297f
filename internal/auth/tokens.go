package auth

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

// Tokens creates, lists, revokes and checks API keys.
type Tokens struct {
	Store TokenStore
}

// TokenStore keeps tokens' records: the server's SQLite store on a single
// host, etcd in a cluster (internal/cluster).
type TokenStore interface {
	AddToken(ctx context.Context, t *store.Token) error
	GetToken(ctx context.Context, idOrName string) (*store.Token, error)
	ListTokens(ctx context.Context) ([]*store.Token, error)
	DeleteToken(ctx context.Context, id string) error
}

var (
	tokenName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)
	tokenID   = regexp.MustCompile(`^[0-9a-f]{12}$`)
)

// CheckRequest checks a new token's name and scopes.
func CheckRequest(name string, scopes []string) error {
	if !tokenName.MatchString(name) {
		return errdefs.Invalid("token name %s is not valid: use letters, digits, '.', '_' and '-', starting with a letter or digit, at most 63", strconv.QuoteToASCII(name))
	}
	if tokenID.MatchString(name) {
		return errdefs.Invalid("token name %q looks like a token id: choose a name that is not 12 hex digits", name)
	}
	if len(scopes) == 0 {
		return errdefs.Invalid("a token needs at least one scope (one of %v)", Known)
	}
	for _, s := range scopes {
		if !Valid(s) {
			return errdefs.Invalid("unknown scope %s: use one of %v", strconv.QuoteToASCII(s), Known)
		}
	}
	return nil
}

// Create makes a token with scopes for project proj (store.AllProjects for
// every project) and returns its record and its key; the key is shown once
// and never stored.
func (t *Tokens) Create(ctx context.Context, name string, scopes []string, proj string) (*store.Token, string, error) {
	if err := CheckRequest(name, scopes); err != nil {
		return nil, "", err
	}
	if proj != store.AllProjects {
		if err := project.Check(proj); err != nil {
			return nil, "", err
		}
	}
	slices.Sort(scopes)
	scopes = slices.Compact(scopes)
	id, key := NewKey()
	_, secret, _ := ParseKey(key)
	rec := &store.Token{ID: id, Name: name, Project: proj, Hash: Hash(secret), Scopes: scopes, CreatedAt: time.Now().UTC()}
	if err := t.Store.AddToken(ctx, rec); err != nil {
		return nil, "", err
	}
	return rec, key, nil
}

// List returns every token (without secrets: there are none to show).
func (t *Tokens) List(ctx context.Context) ([]*store.Token, error) { return t.Store.ListTokens(ctx) }

// Revoke deletes a token by id or name; its key stops working at once.
func (t *Tokens) Revoke(ctx context.Context, idOrName string) (*store.Token, error) {
	rec, err := t.Store.GetToken(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	return rec, t.Store.DeleteToken(ctx, rec.ID)
}

// Authenticate returns the principal of an API key, or an unauthenticated
// error that does not say which part was wrong.
func (t *Tokens) Authenticate(ctx context.Context, key string) (*Principal, error) {
	bad := errdefs.New(errdefs.KindUnauth, client.CodeUnauthenticated, "the API key is not valid (it may have been revoked): check SHARD_API_KEY")
	id, secret, ok := ParseKey(key)
	if !ok {
		return nil, bad
	}
	rec, err := t.Store.GetToken(project.Unscoped(ctx, "authentication: a key's id finds it in every project"), id)
	if err == nil && rec.ID != id { // found by a name: never by a name
		err = errdefs.NotFound(client.CodeTokenNotFound, "no token %s", id)
	}
	if err != nil {
		if errdefs.Is(err, errdefs.KindNotFound) {
			return nil, bad
		}
		return nil, err
	}
	if !Matches(rec.Hash, secret) {
		return nil, bad
	}
	return &Principal{TokenID: rec.ID, Name: rec.Name, Scopes: rec.Scopes, Project: rec.Project}, nil
}
