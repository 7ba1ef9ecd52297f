package image

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// TestImportsPerProject: an import cannot plant an image under a registry
// name or another project's tag. A registry name given to an import is
// 400 with the rule; an archive's own registry names land under
// localhost/ in the importer's project; "python:3.12-slim" still means the
// pulled image; another project sees none of it (404, by name or ID);
// a project key cannot remove a pulled image (403 image_shared).
func TestImportsPerProject(t *testing.T) {
	requireRoot(t)
	host := testRegistry(t)
	ti := makeTestImages(t)
	push(t, host+"/library/python:3.12-slim", ti.other)
	dir := t.TempDir()
	s := openStore(t, dir, func(o *Options) { o.Mirrors = []string{"http://" + host} })
	a := project.With(context.Background(), "team-a")
	b := project.With(context.Background(), "team-b")
	unscoped := own()

	pulled, err := s.Pull(a, "python:3.12-slim", nil)
	if err != nil {
		t.Fatal(err)
	}
	if pulled.Project != "" {
		t.Errorf("a pulled image has project %q", pulled.Project)
	}
	planted := filepath.Join(t.TempDir(), "planted.tar")
	legacyDockerSave(t, planted, []string{"python:3.12-slim"}, false, ti) // ti.app, not ti.other

	for _, n := range []string{"python:3.12-slim", "docker.io/library/python:3.12-slim", host + "/x:1", "localhostx/y:1"} {
		_, err := s.Import(a, planted, n)
		if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), "localhost/NAME[:TAG]") {
			t.Errorf("import as %q: %v, want invalid_argument with the rule", n, err)
		}
		if err := s.CheckImportName(n); errdefs.KindOf(err) != errdefs.KindInvalid {
			t.Errorf("CheckImportName(%q) = %v", n, err)
		}
	}
	imgs, err := s.Import(a, planted, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Name != "localhost/python:3.12-slim" || imgs[0].Project != "team-a" {
		t.Fatalf("import of an archive naming python:3.12-slim: %+v", imgs[0])
	}
	appID := imgs[0].ID
	if _, err := s.Import(b, planted, "localhost/mine:1"); err != nil {
		t.Fatal(err)
	}

	// The registry name still means the pulled image, in every project.
	for _, ctx := range []context.Context{a, b, unscoped} {
		got, err := s.Ensure(ctx, "python:3.12-slim", nil)
		if err != nil || got.ID != pulled.ID || got.Project != "" {
			t.Errorf("python:3.12-slim = %+v, %v; want the pulled image %s", got, err, pulled.ID)
		}
	}
	tests := []struct {
		name string
		ctx  context.Context
		ref  string
		want string // "" not found
	}{
		{"own import by name", a, "localhost/python:3.12-slim", "team-a"},
		{"own import by ID", a, appID[7:19], "team-a"},
		{"another project's import by name", b, "localhost/python:3.12-slim", ""},
		{"another project's import by ID", b, appID, "team-b"}, // b's own import of the same image
		{"b's import from a", a, "localhost/mine:1", ""},
		{"b's own", b, "localhost/mine:1", "team-b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.Get(tt.ctx, tt.ref)
			switch {
			case tt.want == "" && !errdefs.Is(err, errdefs.KindNotFound):
				t.Errorf("Get = %+v, %v; want not found", got, err)
			case tt.want != "" && (err != nil || got.Project != tt.want):
				t.Errorf("Get = %+v, %v; want project %s", got, err, tt.want)
			}
		})
	}
	names := func(ctx context.Context) string {
		l, _ := s.List(ctx)
		var out []string
		for _, i := range l {
			out = append(out, i.Project+":"+i.Name)
		}
		return strings.Join(out, " ")
	}
	if got := names(a); got != "team-a:localhost/python:3.12-slim :python:3.12-slim" {
		t.Errorf("team-a lists %q", got)
	}
	if got := names(b); got != "team-b:localhost/mine:1 :python:3.12-slim" {
		t.Errorf("team-b lists %q", got)
	}
	// Removal: a project's own import; never a pulled image, by name or ID.
	for _, ref := range []string{"python:3.12-slim", pulled.ID} {
		if err := s.Remove(b, ref, false); errdefs.KindOf(err) != errdefs.KindForbidden || errdefs.CodeOf(err) != "image_shared" {
			t.Errorf("project removes pulled %s: %v, want 403 image_shared", ref, err)
		}
	}
	if err := s.Remove(b, "localhost/python:3.12-slim", false); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Errorf("team-b removes team-a's import: %v, want not found", err)
	}
	if err := s.Remove(b, "localhost/mine:1", false); err != nil {
		t.Errorf("team-b removes its own import: %v", err)
	}
	// The index keeps who imported what.
	s2 := openStore(t, dir)
	if got, err := s2.Get(a, "localhost/python:3.12-slim"); err != nil || got.ID != appID || got.Project != "team-a" {
		t.Errorf("after reopen: %+v, %v", got, err)
	}
	if _, err := s2.Get(b, "localhost/python:3.12-slim"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Errorf("after reopen, team-b sees team-a's import: %v", err)
	}
	if err := s2.Remove(unscoped, "python:3.12-slim", true); err != nil {
		t.Errorf("admin removes a pulled image: %v", err)
	}
}

// TestNoProjectRefused: an import belongs to a project, so what finds or
// makes one refuses a context that carries none (under test, a panic
// naming the path) rather than guessing one.
func TestNoProjectRefused(t *testing.T) {
	s := openStore(t, t.TempDir())
	bare := context.Background()
	for _, tt := range []struct {
		name string
		call func()
	}{
		{"Get", func() { s.Get(bare, "localhost/app:1") }},
		{"Ensure", func() { s.Ensure(bare, "localhost/app:1", nil) }},
		{"List", func() { s.List(bare) }},
		{"Remove", func() { s.Remove(bare, "localhost/app:1", false) }},
		{"Export", func() { s.Export(bare, "localhost/app:1", io.Discard) }},
		{"Import", func() { s.Import(bare, filepath.Join(t.TempDir(), "none.tar"), "localhost/app:1") }},
		{"ImportStream", func() { s.ImportStream(bare, strings.NewReader(""), "localhost/app:1") }},
		{"ImportCopy", func() { s.ImportCopy(bare, strings.NewReader(""), "localhost/app:1", "sha256:00", "a") }},
	} {
		func() {
			defer func() {
				if err, _ := recover().(error); !errors.Is(err, project.ErrNoProject) {
					t.Errorf("%s with no project: recovered %v, want ErrNoProject", tt.name, err)
				}
			}()
			tt.call()
		}()
	}
}
