package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// Token is an API key's record: its scopes and the hash of its secret
// (never the key).
type Token struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Project   string    `json:"project,omitempty"` // AllProjects for a key of every project
	Hash      string    `json:"hash"`
	Scopes    []string  `json:"scopes"`
	CreatedAt time.Time `json:"created_at"`
}

// TokenNotFound is the error of a token that is not there (here or in a
// cluster's store).
func TokenNotFound(idOrName string) error {
	return errdefs.NotFound(client.CodeTokenNotFound, "token %s not found (shard token ls lists them)", idOrName)
}

// SecretNotFound is the error of a secret that is not there.
func SecretNotFound(name string) error {
	return errdefs.NotFound(client.CodeSecretNotFound, "secret %s not found (shard secret ls lists them)", name)
}

// AddToken records a token.
func (s *Store) AddToken(ctx context.Context, t *Token) error {
	var err error
	if t.Project, err = projectOf(ctx, t.Project); err != nil {
		return err
	}
	doc, err := json.Marshal(t)
	if err != nil {
		return err
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO tokens(id, project, name, doc) VALUES(?,?,?,?)`, t.ID, t.Project, t.Name, string(doc))
		if err != nil && uniqueViolation(err) {
			return errdefs.Conflict(client.CodeNameTaken, "a token named %s already exists", t.Name)
		}
		return err
	})
}

// GetToken finds a token by id or name.
func (s *Store) GetToken(ctx context.Context, idOrName string) (*Token, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	return getDoc[Token](ctx, s.db, "tokens", `id = ?1 OR name = ?1`, idOrName, TokenNotFound(idOrName))
}

// ListTokens returns every token, oldest first.
func (s *Store) ListTokens(ctx context.Context) ([]*Token, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	out, err := list[Token](ctx, s.db, "tokens")
	slices.SortStableFunc(out, func(a, b *Token) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, err
}

// DeleteToken revokes a token: its key stops working at once.
func (s *Store) DeleteToken(ctx context.Context, id string) error {
	return s.deleteRow(ctx, "tokens", "id", id)
}

// Secret is a stored secret: its value sealed (encrypted) by the server's
// key, never in the clear.
type Secret struct {
	Name      string    `json:"name"`
	Project   string    `json:"project,omitempty"`
	Sealed    []byte    `json:"sealed"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// PutSecret creates or replaces a secret.
func (s *Store) PutSecret(ctx context.Context, sec *Secret) error {
	var err error
	if sec.Project, err = projectOf(ctx, sec.Project); err != nil {
		return err
	}
	doc, err := json.Marshal(sec)
	if err != nil {
		return err
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO secrets(project, name, doc) VALUES(?,?,?) ON CONFLICT(project, name) DO UPDATE SET doc = excluded.doc`, sec.Project, sec.Name, string(doc))
		return err
	})
}

// GetSecret finds a secret by name.
func (s *Store) GetSecret(ctx context.Context, name string) (*Secret, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	return getDoc[Secret](ctx, s.db, "secrets", `name = ?1`, name, SecretNotFound(name))
}

// ListSecrets returns every secret by name.
func (s *Store) ListSecrets(ctx context.Context) ([]*Secret, error) {
	if err := project.Require(ctx); err != nil {
		return nil, err
	}
	out, err := list[Secret](ctx, s.db, "secrets")
	slices.SortStableFunc(out, func(a, b *Secret) int { return strings.Compare(a.Name, b.Name) })
	return out, err
}

// DeleteSecret removes a secret.
func (s *Store) DeleteSecret(ctx context.Context, name string) error {
	return s.deleteRow(ctx, "secrets", "name", name)
}
