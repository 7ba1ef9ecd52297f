package ui

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/useshards/shard/internal/testenv"
)

// TestDistMatchesSource builds web/ afresh (npm ci, npm run build) in a
// temporary copy and checks the result equals the committed dist byte for
// byte: esbuild is deterministic, so a difference is a source change whose
// bundle was not rebuilt and committed (or a bundle edited by hand).
func TestDistMatchesSource(t *testing.T) {
	if !testenv.Strict() {
		t.Skip("builds the console with npm: set SHARD_INTEGRATION=1 to run it")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatal("npm is not installed, and SHARD_INTEGRATION=1 says this run must check the console's bundle: run scripts/install-deps.sh")
	}
	src := filepath.Join("..", "..", "web")
	tmp := t.TempDir()
	web := filepath.Join(tmp, "web")
	// A copy without node_modules: npm ci installs exactly the lock file's.
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			if d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(web, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(web, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmp, "dist")
	for _, args := range [][]string{{"ci", "--no-audit", "--no-fund"}, {"run", "build", "--", "--outdir=" + out}} {
		cmd := exec.Command(npm, args...)
		cmd.Dir = web
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm %v: %v\n%s", args, err, b)
		}
	}
	built := os.DirFS(out)
	want, got := list(t, Files()), list(t, built)
	if !slices.Equal(want, got) {
		t.Fatalf("the committed dist holds %v, a build of web/ makes %v: run npm run build in web/ and commit internal/ui/dist", want, got)
	}
	for _, name := range want {
		a, _ := fs.ReadFile(Files(), name)
		b, _ := fs.ReadFile(built, name)
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from a build of web/: run npm run build in web/ and commit internal/ui/dist", name)
		}
	}
}

func list(t *testing.T, fsys fs.FS) []string {
	t.Helper()
	var out []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
