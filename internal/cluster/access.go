package cluster

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

// Tokens and secrets live in etcd, so a key made on one node works on
// every node and a secret set on one is granted on another. Both keep the
// store's rules: a scoped context sees its own project's records only.

// Tokens is the cluster's token store (auth.TokenStore).
func (c *Cluster) Tokens() *TokenStore { return &TokenStore{c: c} }

// TokenStore keeps API keys' records (hashes, never keys) in etcd; every
// node's mirror holds them, so a key is checked without a round trip and
// still works on a node that has lost etcd. Like the SQLite store, it
// refuses a context that carries no project (project.Require).
type TokenStore struct{ c *Cluster }

func (t *TokenStore) AddToken(ctx context.Context, tok *store.Token) error {
	var err error
	if tok.Project, err = store.ProjectOf(ctx, tok.Project); err != nil {
		return err
	}
	doc, _ := json.Marshal(tok)
	c := t.c
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	nameKey := c.key("token-names", tok.Project, tok.Name)
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(nameKey), "=", 0)).
		Then(clientv3.OpPut(nameKey, tok.ID), clientv3.OpPut(c.key("tokens", tok.ID), string(doc))).Commit()
	if err != nil {
		return Unavailable(err)
	}
	if !resp.Succeeded {
		return errdefs.Conflict(client.CodeNameTaken, "a token named %s already exists", tok.Name)
	}
	c.mirror.put("tokens/"+tok.ID, doc, resp.Header.Revision)
	return nil
}

func (t *TokenStore) GetToken(ctx context.Context, idOrName string) (*store.Token, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	notFound := store.TokenNotFound(idOrName)
	if doc, ok := t.c.mirror.get("tokens/" + idOrName); ok {
		var tok store.Token
		if json.Unmarshal(doc, &tok) == nil {
			if project.Visible(ctx, tok.Project) {
				return &tok, nil
			}
			return nil, notFound
		}
	}
	if tokenIDRe.MatchString(idOrName) {
		// An id the mirror lacks: a token made a moment ago on another
		// node, or none. One key is read, not the whole list; with etcd
		// away a key the mirror never saw is not valid (401, not 503).
		tok, err := t.getByID(ctx, idOrName)
		switch {
		case err == nil && project.Visible(ctx, tok.Project):
			return tok, nil
		case err == nil || errdefs.Is(err, errdefs.KindNotFound):
		case t.c.mirror.current() || t.c.mirror.wasLoaded():
			return nil, notFound
		default:
			return nil, err
		}
	}
	all, err := t.list(ctx)
	if err != nil {
		return nil, err
	}
	var found []*store.Token
	for _, tok := range all {
		if tok.ID == idOrName {
			return tok, nil
		}
		if tok.Name == idOrName {
			found = append(found, tok)
		}
	}
	switch len(found) {
	case 0:
		return nil, notFound
	case 1:
		return found[0], nil
	}
	return nil, store.Ambiguous("token", idOrName)
}

var tokenIDRe = regexp.MustCompile(`^[0-9a-f]{12}$`)

func (t *TokenStore) getByID(ctx context.Context, id string) (*store.Token, error) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	resp, err := t.c.cli.Get(ctx, t.c.key("tokens", id))
	if err != nil {
		return nil, Unavailable(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, store.TokenNotFound(id)
	}
	var tok store.Token
	if err := json.Unmarshal(resp.Kvs[0].Value, &tok); err != nil {
		return nil, err
	}
	t.c.mirror.put("tokens/"+id, resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
	return &tok, nil
}

func (t *TokenStore) ListTokens(ctx context.Context) ([]*store.Token, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	out, err := t.list(ctx)
	slices.SortStableFunc(out, func(a, b *store.Token) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, err
}

// list reads every token visible under ctx from etcd (not the copy: a
// token made a moment ago on another node is there).
func (t *TokenStore) list(ctx context.Context) ([]*store.Token, error) {
	all, err := readAll[store.Token](ctx, t.c, t.c.key("tokens")+"/")
	return slices.DeleteFunc(all, func(tok *store.Token) bool { return !project.Visible(ctx, tok.Project) }), err
}

// readAll reads the records under prefix from etcd (one that is not JSON
// of T skipped).
func readAll[T any](ctx context.Context, c *Cluster, prefix string) ([]*T, error) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	resp, err := c.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, Unavailable(err)
	}
	var out []*T
	for _, kv := range resp.Kvs {
		var v T
		if json.Unmarshal(kv.Value, &v) == nil {
			out = append(out, &v)
		}
	}
	return out, nil
}

func (t *TokenStore) DeleteToken(ctx context.Context, id string) error {
	c := t.c
	tok, err := t.GetToken(ctx, id)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	nameKey := c.key("token-names", tok.Project, tok.Name)
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(nameKey), "=", tok.ID)}, []clientv3.Op{clientv3.OpDelete(nameKey)}, nil),
		clientv3.OpDelete(c.key("tokens", tok.ID)),
	).Commit()
	if err != nil {
		return Unavailable(err)
	}
	c.mirror.del("tokens/"+tok.ID, resp.Header.Revision)
	return nil
}

// Secrets is the cluster's secret store (secrets.Store): sealed values in
// etcd, opened only with SealKey, which never leaves the nodes.
func (c *Cluster) Secrets() *SecretStore { return &SecretStore{c: c} }

// SealKey is the key secrets are sealed with, derived from the cluster key.
func (c *Cluster) SealKey() []byte { return slices.Clone(c.sealKey) }

// SecretStore keeps sealed secrets in etcd. It refuses a context that
// carries no project (project.Require).
type SecretStore struct{ c *Cluster }

func (s *SecretStore) PutSecret(ctx context.Context, sec *store.Secret) error {
	var err error
	if sec.Project, err = store.ProjectOf(ctx, sec.Project); err != nil {
		return err
	}
	doc, _ := json.Marshal(sec)
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	if _, err := s.c.cli.Put(ctx, s.c.key("secrets", sec.Project, sec.Name), string(doc)); err != nil {
		return Unavailable(err)
	}
	return nil
}

func (s *SecretStore) GetSecret(ctx context.Context, name string) (*store.Secret, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	all, err := s.ListSecrets(ctx)
	if err != nil {
		return nil, err
	}
	var found []*store.Secret
	for _, sec := range all {
		if sec.Name == name {
			found = append(found, sec)
		}
	}
	switch len(found) {
	case 0:
		return nil, store.SecretNotFound(name)
	case 1:
		return found[0], nil
	}
	return nil, store.Ambiguous("secret", name)
}

func (s *SecretStore) ListSecrets(ctx context.Context) ([]*store.Secret, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	prefix := s.c.key("secrets") + "/"
	if p, ok := project.From(ctx); ok {
		prefix += p + "/"
	}
	out, err := readAll[store.Secret](ctx, s.c, prefix)
	slices.SortStableFunc(out, func(a, b *store.Secret) int { return strings.Compare(a.Name, b.Name) })
	return out, err
}

func (s *SecretStore) DeleteSecret(ctx context.Context, name string) error {
	sec, err := s.GetSecret(ctx, name)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	if _, err := s.c.cli.Delete(ctx, s.c.key("secrets", sec.Project, sec.Name)); err != nil {
		return Unavailable(err)
	}
	return nil
}
