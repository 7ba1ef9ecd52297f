package auth

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/store"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

func TestCovers(t *testing.T) {
	tests := []struct {
		granted []string
		need    string
		want    bool
	}{
		{nil, None, true},
		{nil, SandboxRead, false},
		{[]string{SandboxRead}, SandboxRead, true},
		{[]string{SandboxRead}, SandboxWrite, false},
		{[]string{"sandbox:*"}, SandboxWrite, true},
		{[]string{SecretAll}, SecretWrite, true},
		{[]string{SecretAll}, SecretAll, true},
		{[]string{SecretWrite}, SecretAll, false},
		{[]string{SecretRead, SecretWrite}, SecretAll, false}, // "secret:*" is asked for as such
		{[]string{All}, PolicyAll, true},
		{[]string{"policy:*"}, "policyx:read", false},
		{[]string{PolicyAll}, PolicyRead, true},
	}
	for _, tt := range tests {
		if got := Covers(tt.granted, tt.need); got != tt.want {
			t.Errorf("Covers(%v, %q) = %v, want %v", tt.granted, tt.need, got, tt.want)
		}
	}
}

func TestKeys(t *testing.T) {
	id, key := NewKey()
	gotID, secret, ok := ParseKey(key)
	if !ok || gotID != id {
		t.Fatalf("ParseKey(%q) = %q, %q, %v", key, gotID, secret, ok)
	}
	h := Hash(secret)
	if !Matches(h, secret) || Matches(h, secret+"x") || Matches(h, "") {
		t.Error("Matches does not tell the secret from others")
	}
	for _, bad := range []string{"", "shk_", "shk_abc_def", "xx_" + key[4:], key + "_more", key[:len(key)-1]} {
		if _, _, ok := ParseKey(bad); ok {
			t.Errorf("ParseKey(%q) accepted a malformed key", bad)
		}
	}
}

func TestPrincipal(t *testing.T) {
	p := &Principal{Name: "ci", Scopes: []string{SandboxWrite}}
	if err := p.Need(SandboxWrite); err != nil {
		t.Fatal(err)
	}
	err := p.Need(SandboxWrite, SecretAll)
	var ms *MissingScope
	if !errors.As(err, &ms) || ms.Scope != SecretAll || errdefs.CodeOf(err) != "missing_scope" || errdefs.KindOf(err) != errdefs.KindForbidden {
		t.Fatalf("Need = %v, want the missing secret:* (403 missing_scope)", err)
	}
	if !Socket.Can(TokenAll) || Socket.Need(All) != nil {
		t.Fatal("the administrator can do everything")
	}
}

func BenchmarkAuthenticate(b *testing.B) {
	ctx := project.Unscoped(context.Background(), "a test")
	st, err := store.Open(ctx, filepath.Join(b.TempDir(), "db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	tk := &Tokens{Store: st}
	_, key, err := tk.Create(ctx, "bench", []string{SandboxRead}, "default")
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := tk.Authenticate(ctx, key); err != nil {
			b.Fatal(err)
		}
	}
}

func TestTokenNames(t *testing.T) {
	ctx := project.Unscoped(context.Background(), "a test")
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tk := &Tokens{Store: st}
	a, key, err := tk.Create(ctx, "ci", []string{SandboxRead}, "default")
	if err != nil {
		t.Fatal(err)
	}
	// A name that looks like an id is refused: it could shadow a token.
	if _, _, err := tk.Create(ctx, a.ID, []string{SandboxRead}, "default"); errdefs.KindOf(err) != errdefs.KindInvalid {
		t.Fatalf("a token named like an id: %v", err)
	}
	if _, err := tk.Authenticate(ctx, key); err != nil {
		t.Fatal(err)
	}
	// A key is found by its id only, never by a name: a token named like
	// a (non-hex) id does not make "shk_<its name>_<its secret>" a key.
	b, keyB, err := tk.Create(ctx, "zzzzzzzzzzzz", []string{All}, "default")
	if err != nil {
		t.Fatal(err)
	}
	_, secretB, _ := ParseKey(keyB)
	if _, err := tk.Authenticate(ctx, "shk_"+b.Name+"_"+secretB); errdefs.KindOf(err) != errdefs.KindUnauth {
		t.Fatalf("a key naming a token by its name: %v", err)
	}
	if _, err := tk.Authenticate(ctx, keyB); err != nil {
		t.Fatal(err)
	}
}

// TestProjectFor: a key of every project acts where its request says
// (default when it says nothing); a project's key acts in its own only;
// a name that is not one is refused before it is echoed.
func TestProjectFor(t *testing.T) {
	all := &Principal{Name: "admin", Project: "*"}
	pa := &Principal{Name: "a", Project: "pa"}
	for _, tt := range []struct {
		p        *Principal
		want     string
		got      string
		wantCode string
	}{
		{all, "", "default", ""},
		{all, "pb", "pb", ""},
		{Socket, "pb", "pb", ""},
		{all, "*", "", "invalid_argument"},
		{all, "../x", "", "invalid_argument"},
		{pa, "", "pa", ""},
		{pa, "pa", "pa", ""},
		{pa, "pb", "", "wrong_project"},
		{pa, "default", "", "wrong_project"},
		{pa, "\x1b[31m", "", "invalid_argument"},
		{Anonymous, "", "", "no_project"},
		{Anonymous, "default", "", "no_project"},
		{&Principal{Name: "old", Scopes: []string{All}}, "", "", "no_project"},
		{&Principal{Name: "vouched", Project: "-"}, "", "", "no_project"},
	} {
		got, err := tt.p.ProjectFor(tt.want)
		code := ""
		if err != nil {
			code = errdefs.CodeOf(err)
		}
		if got != tt.got || code != tt.wantCode {
			t.Errorf("%s.ProjectFor(%q) = %q, %v; want %q, code %q", tt.p.Name, tt.want, got, err, tt.got, tt.wantCode)
		}
		if err != nil && strings.Contains(err.Error(), "\x1b") {
			t.Errorf("%s.ProjectFor(%q): the message carries the raw name: %v", tt.p.Name, tt.want, err)
		}
	}
}

// TestAnonymous: a request with no principal is Anonymous's, which may call
// only what needs no scope, is not the administrator and acts in no
// project; the socket's principal is the administrator, explicitly.
func TestAnonymous(t *testing.T) {
	if p := From(context.Background()); p != Anonymous {
		t.Fatalf("From(a context with none) = %+v, want Anonymous", p)
	}
	if p, ok := Lookup(context.Background()); p != Anonymous || ok {
		t.Errorf("Lookup(a context with none) = %+v, %v; want Anonymous, false", p, ok)
	}
	if p, ok := Lookup(WithPrincipal(context.Background(), nil)); p != Anonymous || !ok {
		t.Errorf("Lookup(WithPrincipal(nil)) = %+v, %v; want Anonymous, true", p, ok)
	}
	if p := From(WithPrincipal(context.Background(), Socket)); p != Socket {
		t.Errorf("From(WithPrincipal(Socket)) = %+v", p)
	}
	if Anonymous.AllProjects() || Anonymous.Admin {
		t.Error("Anonymous may act in every project")
	}
	if !Socket.AllProjects() || !Socket.Admin {
		t.Error("the socket's principal is not the administrator")
	}
	if err := Anonymous.Need(None); err != nil {
		t.Errorf("Anonymous.Need(None) = %v, want nil", err)
	}
	for _, scope := range append([]string{AnyKey}, Known...) {
		if Anonymous.Can(scope) {
			t.Errorf("Anonymous.Can(%s)", scope)
		}
		if err := Anonymous.Need(scope); errdefs.KindOf(err) != errdefs.KindUnauth {
			t.Errorf("Anonymous.Need(%s) = %v, want unauthenticated (it has no key)", scope, err)
		}
	}
}

// TestCan: who may do what, by principal and scope.
func TestCan(t *testing.T) {
	ci := &Principal{Name: "ci", Project: "pa", Scopes: []string{SandboxRead}}
	for _, tt := range []struct {
		p     *Principal
		scope string
		want  bool
	}{
		{Anonymous, None, true},
		{Anonymous, AnyKey, false},
		{Anonymous, SandboxRead, false},
		{ci, None, true},
		{ci, AnyKey, true},
		{ci, SandboxRead, true},
		{ci, SandboxWrite, false},
		{Socket, All, true},
		{Socket, TokenWrite, true},
	} {
		if got := tt.p.Can(tt.scope); got != tt.want {
			t.Errorf("%s.Can(%q) = %v, want %v", tt.p.Name, tt.scope, got, tt.want)
		}
	}
}
