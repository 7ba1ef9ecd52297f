package secrets

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

func TestSealedAtRest(t *testing.T) {
	ctx := project.With(context.Background(), project.Default) // as a request of the default project
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s, err := Open(st, filepath.Join(dir, "secret.key"))
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "secret.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	value := []byte("hunter2-super-secret")
	if _, err := s.Set(ctx, "API_KEY", value); err != nil {
		t.Fatal(err)
	}
	got, err := s.Value(ctx, "API_KEY")
	if err != nil || !bytes.Equal(got, value) {
		t.Fatalf("Value = %q, %v", got, err)
	}
	st.Close()
	db, _ := os.ReadFile(filepath.Join(dir, "db"))
	wal, _ := os.ReadFile(filepath.Join(dir, "db-wal"))
	if bytes.Contains(db, value) || bytes.Contains(wal, value) {
		t.Fatal("the value is in the database in the clear")
	}
	// Another key cannot open it.
	st2, _ := store.Open(ctx, filepath.Join(dir, "db"))
	defer st2.Close()
	other, _ := Open(st2, filepath.Join(t.TempDir(), "other.key"))
	if _, err := other.Value(ctx, "API_KEY"); err == nil {
		t.Fatal("a different key opened the secret")
	}
	same, _ := Open(st2, filepath.Join(dir, "secret.key"))
	if got, err := same.Value(ctx, "API_KEY"); err != nil || !bytes.Equal(got, value) {
		t.Fatalf("after reopening: %q %v", got, err)
	}
}

func TestSetErrors(t *testing.T) {
	ctx := project.With(context.Background(), project.Default) // as a request of the default project
	dir := t.TempDir()
	st, _ := store.Open(ctx, filepath.Join(dir, "db"))
	defer st.Close()
	s, _ := Open(st, filepath.Join(dir, "k"))
	for _, tt := range []struct {
		name  string
		value []byte
	}{{"bad name!", []byte("x")}, {"", []byte("x")}, {"ok", nil}, {"big", make([]byte, MaxValue+1)}} {
		if _, err := s.Set(ctx, tt.name, tt.value); errdefs.KindOf(err) != errdefs.KindInvalid {
			t.Errorf("Set(%q, %d bytes) = %v, want invalid", tt.name, len(tt.value), err)
		}
	}
	if _, err := s.Value(ctx, "missing"); errdefs.CodeOf(err) != "secret_not_found" {
		t.Errorf("Value(missing) = %v", err)
	}
}
