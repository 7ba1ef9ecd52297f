package guest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/internal/agent/host"
	"github.com/useshards/shard/internal/agent/proto"
)

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func codeOf(err error) string {
	var ge *grantError
	if errors.As(err, &ge) {
		return ge.code
	}
	return ""
}

// noTemp fails if a temporary file of putGrantFile is left in dir.
func noTemp(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".shard-grant-") {
			t.Fatalf("temporary file %s left", e.Name())
		}
	}
}

func TestPutGrantFileCreates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "etc", "app", "tls.key")
	made, err := putGrantFile(path, []byte("s3cret"), 0o400, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(dir, "etc"), filepath.Join(dir, "etc", "app")}; !reflect.DeepEqual(made, want) {
		t.Fatalf("made %q, want %q", made, want)
	}
	if got := readFile(t, path); got != "s3cret" {
		t.Fatalf("content %q", got)
	}
	st, err := os.Lstat(path)
	if err != nil || st.Mode() != 0o400 {
		t.Fatalf("mode %v %v", st.Mode(), err)
	}
	noTemp(t, filepath.Dir(path))
	// The grant owns it now: writing it again replaces it.
	if made, err := putGrantFile(path, []byte("new"), 0o400, true); err != nil || len(made) != 0 {
		t.Fatalf("replace: %q %v", made, err)
	}
	if got := readFile(t, path); got != "new" {
		t.Fatalf("content after replace %q", got)
	}
	// Removing it takes the directories it made, when empty.
	if left, err := removeGrantFile(path, 0o400, made0(dir)); err != nil || left != "" {
		t.Fatalf("remove: %q %v", left, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "etc")); !os.IsNotExist(err) {
		t.Fatalf("the directories the grant made are left: %v", err)
	}
}

func made0(dir string) []string {
	return []string{filepath.Join(dir, "etc"), filepath.Join(dir, "etc", "app")}
}

func TestPutGrantFileRefusesExisting(t *testing.T) {
	dir := t.TempDir()
	passwd := filepath.Join(dir, "passwd")
	if err := os.WriteFile(passwd, []byte("root:x:0:0::/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink(filepath.Join(dir, "nowhere"), dangling); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	looksGranted := filepath.Join(dir, "granted-looking")
	if err := os.WriteFile(looksGranted, []byte("other"), 0o400); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		path    string
		replace bool
	}{
		{"a file", passwd, false},
		{"a file, though the grant would own it", passwd, true}, // mode 0644: not what a grant writes
		{"a symlink", link, false},
		{"a symlink, though the grant would own it", link, true},
		{"a dangling symlink", dangling, false},
		{"a directory", sub, false},
		{"a file that looks granted, not owned", looksGranted, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := putGrantFile(tc.path, []byte("SECRET"), 0o400, tc.replace)
			if codeOf(err) != proto.CodePathExists {
				t.Fatalf("err %v, want %s", err, proto.CodePathExists)
			}
			noTemp(t, dir)
		})
	}
	if got := readFile(t, passwd); !strings.HasPrefix(got, "root:") {
		t.Fatalf("passwd changed: %q", got)
	}
	if got := readFile(t, target); got != "keep" {
		t.Fatalf("the symlink's target changed: %q", got)
	}
	if _, err := os.Lstat(filepath.Join(dir, "nowhere")); !os.IsNotExist(err) {
		t.Fatal("written through a dangling symlink")
	}
	if got := readFile(t, looksGranted); got != "other" {
		t.Fatalf("a file the grant does not own was replaced: %q", got)
	}
}

func TestGrantFileFollowsNoSymlink(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "via")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plain"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{
		filepath.Join(dir, "via", "key"),
		filepath.Join(dir, "via", "new", "key"),
		filepath.Join(dir, "plain", "key"),
	} {
		_, err := putGrantFile(p, []byte("SECRET"), 0o400, false)
		if codeOf(err) != proto.CodePathUnsafe {
			t.Fatalf("%s: err %v, want %s", p, err, proto.CodePathUnsafe)
		}
	}
	if ents, _ := os.ReadDir(real); len(ents) != 0 {
		t.Fatalf("written through a symlinked directory: %v", ents)
	}
	for _, p := range []string{"", "relative/key", "/a/../b", "/a//b", "/a/b/"} {
		if _, err := putGrantFile(p, nil, 0o400, false); err == nil {
			t.Fatalf("path %q accepted", p)
		}
	}
}

// TestRemoveGrantFileLeavesWhatIsNotItsOwn: between grant and ungrant, the
// sandbox swaps the granted file (or a directory above it) for a symlink
// to a file it wants gone, or for a file of its own: the ungrant removes
// none of them.
func TestRemoveGrantFileLeavesWhatIsNotItsOwn(t *testing.T) {
	for _, tc := range []struct {
		name string
		swap func(t *testing.T, dir, key, shadow string)
		left bool // the entry at key is left
	}{
		{"still the grant's", func(t *testing.T, dir, key, shadow string) {}, false},
		{"gone", func(t *testing.T, dir, key, shadow string) { os.Remove(key) }, false},
		{"symlink to another file", func(t *testing.T, dir, key, shadow string) {
			os.Remove(key)
			must(t, os.Symlink(shadow, key))
		}, true},
		{"hard link to another file", func(t *testing.T, dir, key, shadow string) {
			os.Remove(key)
			must(t, os.Link(shadow, key))
		}, false}, // shadow's mode is 0400 too: its name at key goes, shadow stays
		{"a file of another mode", func(t *testing.T, dir, key, shadow string) {
			os.Remove(key)
			must(t, os.WriteFile(key, []byte("mine"), 0o644))
		}, true},
		{"a directory", func(t *testing.T, dir, key, shadow string) {
			os.Remove(key)
			must(t, os.Mkdir(key, 0o700))
		}, true},
		{"parent swapped for a symlink", func(t *testing.T, dir, key, shadow string) {
			parent := filepath.Dir(key)
			must(t, os.Rename(parent, parent+".old"))
			must(t, os.Symlink(filepath.Dir(shadow), parent))
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			etc := filepath.Join(dir, "etc")
			must(t, os.Mkdir(etc, 0o755))
			shadow := filepath.Join(etc, "key") // same base name as the grant's file
			must(t, os.WriteFile(shadow, []byte("root:*:"), 0o400))
			key := filepath.Join(dir, "run", "app", "key")
			made, err := putGrantFile(key, []byte("SECRET"), 0o400, false)
			if err != nil {
				t.Fatal(err)
			}
			tc.swap(t, dir, key, shadow)
			left, err := removeGrantFile(key, 0o400, made)
			if err != nil {
				t.Fatal(err)
			}
			if (left != "") != tc.left {
				t.Fatalf("left %q, want something left: %v", left, tc.left)
			}
			if got := readFile(t, shadow); got != "root:*:" {
				t.Fatalf("the other file: %q", got)
			}
			_, err = os.Lstat(key)
			if tc.left && err != nil {
				t.Fatalf("what the sandbox put at the path was removed: %v", err)
			}
			if !tc.left && !os.IsNotExist(err) {
				t.Fatalf("the grant's file is still there: %v", err)
			}
		})
	}
}

func TestRemoveGrantFileKeepsBusyDirectories(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "a", "b", "key")
	made, err := putGrantFile(key, []byte("x"), 0o400, false)
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.WriteFile(filepath.Join(dir, "a", "other"), nil, 0o644))
	if _, err := removeGrantFile(key, 0o400, made); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a", "b")); !os.IsNotExist(err) {
		t.Fatal("the empty directory the grant made is left")
	}
	if _, err := os.Stat(filepath.Join(dir, "a", "other")); err != nil {
		t.Fatal("a directory with someone else's file in it was removed")
	}
	// Absent is fine.
	if left, err := removeGrantFile(key, 0o400, nil); err != nil || left != "" {
		t.Fatalf("absent: %q %v", left, err)
	}
}

// TestGrantFileOps: through the agent's protocol, refusals carry a code.
func TestGrantFileOps(t *testing.T) {
	c := testAgent(t)
	dir := t.TempDir()
	existing := filepath.Join(dir, "passwd")
	must(t, os.WriteFile(existing, []byte("root"), 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.Do(ctx, proto.Request{Op: proto.OpGrantFile, Path: existing, Data: []byte("SECRET"), Mode: 0o400})
	if err == nil || r == nil || r.Code != proto.CodePathExists || !strings.Contains(r.Error, existing) {
		t.Fatalf("grant over an existing file: %+v %v", r, err)
	}
	key := filepath.Join(dir, "d", "key")
	r, err = c.Do(ctx, proto.Request{Op: proto.OpGrantFile, Path: key, Data: []byte("SECRET"), Mode: 0o400})
	if err != nil || !reflect.DeepEqual(r.Made, []string{filepath.Join(dir, "d")}) {
		t.Fatalf("grant: %+v %v", r, err)
	}
	os.Remove(key)
	must(t, os.Symlink(existing, key))
	r, err = c.Do(ctx, proto.Request{Op: proto.OpUngrantFile, Path: key, Mode: 0o400, Dirs: r.Made})
	if err != nil || !strings.Contains(r.Left, "symlink") {
		t.Fatalf("ungrant of a swapped file: %+v %v", r, err)
	}
	if readFile(t, existing) != "root" {
		t.Fatal("the symlink's target changed")
	}
	if r, err := c.Do(ctx, proto.Request{Op: "put_file", Path: key}); !errors.Is(err, host.ErrUnsupported) || !r.UnknownOp {
		t.Fatalf("the old op: %+v %v", r, err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
