// Package secrets keeps named secrets encrypted at rest (AES-256-GCM under
// a key file in the data directory, readable by root only) and hands their
// values out only to the code that puts them into a sandbox. Nothing here
// logs or returns a value to the API.
package secrets

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"time"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/store"
)

// MaxValue bounds a secret's value.
const MaxValue = 256 << 10

// Service sets, lists, removes and opens secrets.
type Service struct {
	store Store
	aead  cipher.AEAD
}

// Store keeps sealed secrets: the server's SQLite store on a single host,
// etcd in a cluster (internal/cluster).
type Store interface {
	PutSecret(ctx context.Context, sec *store.Secret) error
	GetSecret(ctx context.Context, name string) (*store.Secret, error)
	ListSecrets(ctx context.Context) ([]*store.Secret, error)
	DeleteSecret(ctx context.Context, name string) error
}

// Open loads (or makes, on first use) the key at keyPath.
func Open(st Store, keyPath string) (*Service, error) {
	key, err := os.ReadFile(keyPath)
	if errors.Is(err, fs.ErrNotExist) {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		if err := os.WriteFile(keyPath+".tmp", key, 0o600); err != nil {
			return nil, err
		}
		if err := os.Rename(keyPath+".tmp", keyPath); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("secret key %s: %d bytes, want 32", keyPath, len(key))
	}
	return New(st, key)
}

// New seals with key (32 bytes): a cluster's nodes share theirs.
func New(st Store, key []byte) (*Service, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Service{store: st, aead: aead}, nil
}

var nameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// ValidName checks a secret's name.
func ValidName(name string) error {
	if !nameRe.MatchString(name) {
		return errdefs.Invalid("secret name %q is not valid: use letters, digits, '.', '_' and '-', at most 128", name)
	}
	return nil
}

// Set stores value under name (replacing any), sealed; the name is the
// additional data, so a sealed value cannot be moved to another name.
func (s *Service) Set(ctx context.Context, name string, value []byte) (*store.Secret, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if len(value) == 0 {
		return nil, errdefs.Invalid("secret %s: the value is empty", name)
	}
	if len(value) > MaxValue {
		return nil, errdefs.Invalid("secret %s: the value is %d bytes, at most %d", name, len(value), MaxValue)
	}
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	sec := &store.Secret{Name: name, Sealed: s.aead.Seal(nonce, nonce, value, []byte(name)), CreatedAt: now, UpdatedAt: now}
	if old, err := s.store.GetSecret(ctx, name); err == nil {
		sec.CreatedAt = old.CreatedAt
	}
	return sec, s.store.PutSecret(ctx, sec)
}

// Value opens a secret.
func (s *Service) Value(ctx context.Context, name string) ([]byte, error) {
	sec, err := s.store.GetSecret(ctx, name)
	if err != nil {
		return nil, err
	}
	n := s.aead.NonceSize()
	if len(sec.Sealed) < n {
		return nil, fmt.Errorf("secret %s is damaged", name)
	}
	v, err := s.aead.Open(nil, sec.Sealed[:n], sec.Sealed[n:], []byte(name))
	if err != nil {
		return nil, fmt.Errorf("secret %s cannot be opened with this server's key: %w", name, err)
	}
	return v, nil
}

// Get returns a secret's record (its value stays sealed).
func (s *Service) Get(ctx context.Context, name string) (*store.Secret, error) {
	return s.store.GetSecret(ctx, name)
}

// List returns every secret's record.
func (s *Service) List(ctx context.Context) ([]*store.Secret, error) { return s.store.ListSecrets(ctx) }

// Remove deletes a secret. Sandboxes granted it keep what they were given
// (a file stays; an env grant gives nothing to new execs).
func (s *Service) Remove(ctx context.Context, name string) error {
	if _, err := s.store.GetSecret(ctx, name); err != nil {
		return err
	}
	return s.store.DeleteSecret(ctx, name)
}
