package fsdiff

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/testenv"
	"golang.org/x/sys/unix"
)

func write(t *testing.T, root, rel, body string) {
	t.Helper()
	p := filepath.Join(root, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDiff needs root: whiteouts are device nodes and opaque directories
// trusted xattrs, as overlayfs makes them (the test suite runs as root).
func TestDiff(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestDiff makes whiteouts (mknod) and trusted xattrs: run the unit tests as root (scripts/test.sh does)")
	}
	lower, a, b := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, lower, "etc/a", "1\n")
	write(t, lower, "etc/b", "b\n")
	write(t, lower, "etc/same", "same\n")
	write(t, lower, "opt/dir/p", "p")
	write(t, lower, "opt/dir/q", "q")
	// A changed etc/a, removed etc/b, added home/u/file; copied etc/same up
	// unchanged.
	write(t, a, "etc/a", "2\n")
	if err := unix.Mknod(filepath.Join(a, "etc/b"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	write(t, a, "etc/same", "same\n")
	write(t, a, "home/u/file", "mine")
	// B added new, and replaced opt/dir with one of its own (opaque).
	write(t, b, "new", "\x00binary")
	write(t, b, "opt/dir/r", "r")
	if err := unix.Lsetxattr(filepath.Join(b, "opt/dir"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	os.Symlink("/etc/a", filepath.Join(b, "link"))
	os.Chmod(filepath.Join(b, "opt"), 0o755)

	res, err := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{Patch: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range res.Changes {
		got = append(got, c.Kind+" "+c.Path+" "+strings.Join(c.What, ","))
	}
	want := []string{
		"changed /etc/a content",
		"added /etc/b ",
		"removed /home ",
		"removed /home/u ",
		"removed /home/u/file ",
		"added /link ",
		"added /new ",
		"removed /opt/dir/p ",
		"removed /opt/dir/q ",
		"added /opt/dir/r ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("changes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if res.Added != 4 || res.Removed != 5 || res.Changed != 1 {
		t.Errorf("counts %d %d %d", res.Added, res.Removed, res.Changed)
	}
	if p := res.Changes[0].Patch; !strings.Contains(p, "-2\n+1\n") || !strings.Contains(p, "--- a/etc/a") {
		t.Errorf("patch of /etc/a:\n%s", p)
	}
	if p := res.Changes[6].Patch; !strings.HasPrefix(p, "Binary files") {
		t.Errorf("patch of /new: %q", p)
	}
	// The other way round, a removal is an addition.
	rev, _ := Diff(t.Context(), Tree{Upper: b}, Tree{Upper: a}, []string{lower}, Options{})
	if rev.Added != 5 || rev.Removed != 4 || rev.Changed != 1 {
		t.Errorf("reversed counts %d %d %d", rev.Added, rev.Removed, rev.Changed)
	}
	// A bound on changes.
	few, _ := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{MaxChanges: 3})
	if !few.Truncated || len(few.Changes) != 3 {
		t.Errorf("bounded: %d changes, truncated %v", len(few.Changes), few.Truncated)
	}
	// The same tree: nothing.
	same, _ := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: a}, []string{lower}, Options{})
	if len(same.Changes) != 0 {
		t.Errorf("a tree against itself: %+v", same.Changes)
	}
}

// TestDiffLayerSymlinkStaysInTheImage: an image whose lower layer has
// "data" as a symlink to a host directory and whose upper layer has "data"
// as a directory (overlayfs shows the directory and never follows the
// lower symlink). A sandbox that replaces or removes /data must not make
// the diff list or read the host directory's files.
func TestDiffLayerSymlinkStaysInTheImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("makes whiteouts and trusted xattrs: run as root")
	}
	host := t.TempDir()
	write(t, host, "shadow", "HOST-SECRET\n")
	write(t, host, "sub/conf", "host conf\n")
	l1, l2, empty := t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.Symlink(host, filepath.Join(l1, "data")); err != nil {
		t.Fatal(err)
	}
	write(t, l2, "data/keep", "image file\n")
	replaced, removed := t.TempDir(), t.TempDir()
	os.Mkdir(filepath.Join(replaced, "data"), 0o755)
	if err := unix.Lsetxattr(filepath.Join(replaced, "data"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(removed, "data"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]string{"replaced": replaced, "removed": removed} {
		res, err := Diff(t.Context(), Tree{Upper: empty}, Tree{Upper: b}, []string{l1, l2}, Options{Patch: true})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range res.Changes {
			got = append(got, c.Kind+" "+c.Path)
			if strings.Contains(c.Patch, "HOST") || strings.Contains(c.Path, "shadow") || strings.Contains(c.Path, "sub") {
				t.Errorf("%s: the diff reached the host through the image's symlink: %+v", name, c)
			}
		}
		if want := "removed /data/keep"; !slicesContains(got, want) {
			t.Errorf("%s: %q not in %q", name, want, got)
		}
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestPatchApplies: the patches of names with a space, a tab, a quote, a
// backslash and a non-ASCII letter, a file added and one removed, files of
// CRLF lines, a form feed and ESC sequences, applied by GNU patch -p1 and
// by git apply to a copy of A, make it B.
func TestPatchApplies(t *testing.T) {
	names := []string{"d/my file", "d/tab\tq\"", `d/back\slash`, "d/café", "plain"}
	lower, a, b := t.TempDir(), t.TempDir(), t.TempDir()
	for _, n := range names {
		write(t, a, n, "old "+n+"\n")
		write(t, b, n, "new "+n+"\n")
	}
	write(t, a, "d/rm me", "gone\n")
	write(t, b, "d/new file", "hello\n")
	// Content a terminal would act on, which the patch carries as it is.
	write(t, a, "crlf", "one\r\ntwo\r\n")
	write(t, b, "crlf", "one\r\nTWO\r\n")
	write(t, a, "ff", "page\f1\n")
	write(t, b, "ff", "page\f2\n")
	write(t, a, "esc", "\x1b[31mred\x1b[0m\n")
	write(t, b, "esc", "\x1b[32mgreen\x1b[0m\n")
	res, err := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{Patch: true})
	if err != nil {
		t.Fatal(err)
	}
	var patch strings.Builder
	for _, c := range res.Changes {
		patch.WriteString(c.Patch)
	}
	for _, tool := range [][]string{{"patch", "-p1", "--batch"}, {"git", "apply"}} {
		if _, err := exec.LookPath(tool[0]); err != nil {
			if testenv.Strict() {
				t.Fatalf("%s is not installed: scripts/install-deps.sh installs it", tool[0])
			}
			t.Skipf("%s is not installed", tool[0])
		}
		dir := t.TempDir()
		if err := os.CopyFS(dir, os.DirFS(a)); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(tool[0], tool[1:]...)
		cmd.Dir, cmd.Stdin = dir, strings.NewReader(patch.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s\nthe patch:\n%s", strings.Join(tool, " "), err, out, patch.String())
		}
		if out, err := exec.Command("diff", "-r", dir, b).CombinedOutput(); err != nil {
			t.Errorf("%s did not make B: %v\n%s\nthe patch:\n%s", strings.Join(tool, " "), err, out, patch.String())
		}
	}
}

func TestHeaderName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"a/plain", "a/plain"},
		{"/dev/null", "/dev/null"},
		{"a/my file", "a/my file\t"},
		{"a/tab\tq\"", `"a/tab\tq\""`},
		{`a/back\slash x`, `"a/back\\slash x"`},
		{"a/café", `"a/caf\303\251"`},
		{"a/bell\a\x7f\xff", `"a/bell\a\177\377"`},
	} {
		if got := headerName(tc.in); got != tc.want {
			t.Errorf("headerName(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestSkipIsExact: a path in Skip is left out by itself, not what is below
// it: a file beside the skipped ones, in a skipped directory both sides
// have or in one only B has, is listed.
func TestSkipIsExact(t *testing.T) {
	lower, a, b := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, lower, "run/shard/fork", "image\n")
	write(t, a, "run/shard/fork", "a\n")
	write(t, b, "run/shard/fork", "b\n")
	write(t, b, "run/shard/hidden", "mine\n")
	write(t, b, ".shard/x", "mine\n")
	write(t, b, ".shard/shard", "agent\n")
	write(t, b, "etc/hosts", "hosts\n")
	res, err := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{Skip: serverSkip})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range res.Changes {
		got = append(got, c.Kind+" "+c.Path)
	}
	want := []string{"added /.shard/x", "added /etc", "added /run/shard/hidden"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") || res.Added != 3 {
		t.Errorf("changes (%d added):\n%s\nwant:\n%s", res.Added, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

var serverSkip = []Skip{{"/.shard", "dir", false}, {"/.shard/shard", "file", false}, {"/etc/hosts", "file", false},
	{"/run/shard", "dir", false}, {"/run/shard/fork", "file", false}, {"/run", "dir", true}}

// TestSkipIfAdded: a directory the server makes above its own paths where
// the image has none (busybox has no /run) is not listed as added; a change
// of the image's own directory there is.
func TestSkipIfAdded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		image bool   // the image has /run
		mode  uint32 // /run's mode in the sandbox
		want  string
	}{
		{"made by the server", false, 0o755, ""},
		{"the image's, as it was", true, 0o755, ""},
		{"the image's, its mode changed", true, 0o700, "changed /run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lower, a, b := t.TempDir(), t.TempDir(), t.TempDir()
			if tc.image {
				if err := os.Mkdir(filepath.Join(lower, "run"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.MkdirAll(filepath.Join(b, "run/shard"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(b, "run"), os.FileMode(tc.mode)); err != nil {
				t.Fatal(err)
			}
			res, err := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{Skip: serverSkip})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range res.Changes {
				got = append(got, c.Kind+" "+c.Path)
			}
			if want := []string{tc.want}; tc.want == "" && len(got) != 0 || tc.want != "" && !slices.Equal(got, want) {
				t.Errorf("changes %q, want %q", got, tc.want)
			}
		})
	}
}

// TestSkipIsOfItsType: a skipped path is left out only while it is of the
// type the server puts there: a file of the sandbox's own data where the
// server has a directory, or a symlink where it has a file, is listed.
func TestSkipIsOfItsType(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b func(t *testing.T, dir string)
		want string // the change listed, "" none
	}{
		{"the server's directory", func(t *testing.T, dir string) { os.MkdirAll(filepath.Join(dir, "run/shard"), 0o755) },
			func(t *testing.T, dir string) { os.MkdirAll(filepath.Join(dir, "run/shard"), 0o700) }, ""},
		{"a file in place of the directory", nil,
			func(t *testing.T, dir string) { write(t, dir, "run/shard", "data of the sandbox's own\n") }, "added /run/shard"},
		{"the directory replaced by a file", func(t *testing.T, dir string) { os.MkdirAll(filepath.Join(dir, "run/shard"), 0o755) },
			func(t *testing.T, dir string) { write(t, dir, "run/shard", "data\n") }, "changed /run/shard"},
		{"the directory replaced by a symlink", func(t *testing.T, dir string) { os.MkdirAll(filepath.Join(dir, "run/shard"), 0o755) },
			func(t *testing.T, dir string) {
				os.MkdirAll(filepath.Join(dir, "run"), 0o755)
				os.Symlink("/etc", filepath.Join(dir, "run/shard"))
			}, "changed /run/shard"},
		{"a symlink in place of a file", nil, func(t *testing.T, dir string) {
			os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
			os.Symlink("/elsewhere", filepath.Join(dir, "etc/hosts"))
		}, "added /etc/hosts"},
		{"the server's file", nil, func(t *testing.T, dir string) { write(t, dir, "etc/hosts", "hosts\n") }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lower, a, b := t.TempDir(), t.TempDir(), t.TempDir()
			for _, side := range []struct {
				dir string
				mk  func(t *testing.T, dir string)
			}{{a, tc.a}, {b, tc.b}} {
				if side.mk != nil {
					side.mk(t, side.dir)
				}
			}
			res, err := Diff(t.Context(), Tree{Upper: a}, Tree{Upper: b}, []string{lower}, Options{Skip: serverSkip})
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			for _, c := range res.Changes {
				if c.Path == "/run/shard" || c.Path == "/etc/hosts" {
					got = c.Kind + " " + c.Path
				}
			}
			if got != tc.want {
				t.Errorf("got %q, want %q (%+v)", got, tc.want, res.Changes)
			}
		})
	}
}
