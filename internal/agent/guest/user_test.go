package guest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mkfile creates path with mode and returns it.
func mkfile(t *testing.T, path string, mode os.FileMode) string {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), mode); err != nil {
		t.Fatal(err)
	}
	// WriteFile's mode is filtered by the umask.
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	other := t.TempDir()
	prog := mkfile(t, filepath.Join(dir, "prog"), 0o755)
	mkfile(t, filepath.Join(dir, "noexec"), 0o644)
	mkfile(t, filepath.Join(other, "prog"), 0o755) // shadowed by dir's
	if err := os.Mkdir(filepath.Join(dir, "subdir"), 0o755); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name, path string
		want       string // "" means an error is expected
		wantErr    string // substring of the error
	}{
		{"prog", dir, prog, ""},
		{"prog", "/nonexistent-shard-test:" + dir, prog, ""},
		{"prog", dir + ":" + other, prog, ""}, // first match wins
		{"prog", other + ":" + dir, filepath.Join(other, "prog"), ""},
		{"noexec", dir, "", "command not found"},
		{"subdir", dir, "", "command not found"},
		{"missing", dir, "", "command not found in the sandbox (PATH=" + dir + ")"},
		{prog, "", prog, ""},                        // a path is used as given
		{prog, "/nonexistent-shard-test", prog, ""}, // ... whatever PATH says
		{filepath.Join(dir, "noexec"), "", "", "permission denied"},
		{filepath.Join(dir, "subdir"), "", "", "is a directory"},
		{filepath.Join(dir, "missing"), "", "", "no such file"},
	}
	for _, tt := range tests {
		got, err := lookPath(tt.name, tt.path)
		if tt.want != "" {
			if err != nil || got != tt.want {
				t.Errorf("lookPath(%q, %q) = %q, %v; want %q, nil", tt.name, tt.path, got, err, tt.want)
			}
			continue
		}
		if err == nil {
			t.Errorf("lookPath(%q, %q) = %q, nil; want an error", tt.name, tt.path, got)
			continue
		}
		if !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("lookPath(%q, %q) error = %q, want it to contain %q", tt.name, tt.path, err, tt.wantErr)
		}
	}
}

func TestLookPathDefaultPATH(t *testing.T) {
	got, err := lookPath("sh", "")
	if err != nil {
		t.Fatalf("lookPath(%q, \"\") = %v, want the default PATH to find it", "sh", err)
	}
	if filepath.Base(got) != "sh" || !filepath.IsAbs(got) {
		t.Errorf("lookPath(%q, \"\") = %q, want an absolute path to sh", "sh", got)
	}
}

// An empty PATH element is the working directory, as in a shell.
func TestLookPathEmptyElementIsCwd(t *testing.T) {
	dir := t.TempDir()
	mkfile(t, filepath.Join(dir, "prog"), 0o755)
	t.Chdir(dir)
	for _, path := range []string{":/nonexistent-shard-test", "/nonexistent-shard-test:", "/nonexistent-shard-test::/x"} {
		got, err := lookPath("prog", path)
		if err != nil || got != "prog" {
			t.Errorf("lookPath(%q, %q) = %q, %v; want %q, nil", "prog", path, got, err, "prog")
		}
	}
}

func TestLookupUser(t *testing.T) {
	tests := []struct {
		spec     string
		wantNil  bool // no credential: the agent's own user
		uid, gid uint32
		home     string
	}{
		{"", true, 0, 0, "/root"},
		{"root", false, 0, 0, "/root"},
		{"0", false, 0, 0, "/root"},
		{"0:0", false, 0, 0, "/root"},
		{"root:root", false, 0, 0, "/root"},
		{"root:0", false, 0, 0, "/root"},
		{"root:4242", false, 0, 4242, "/root"}, // a numeric group need not exist
		// A numeric uid missing from /etc/passwd is allowed, with gid = uid.
		{"4242", false, 4242, 4242, "/"},
		{"4242:4343", false, 4242, 4343, "/"},
	}
	for _, tt := range tests {
		cred, home, err := lookupUser(tt.spec)
		if err != nil {
			t.Errorf("lookupUser(%q) error = %v, want nil", tt.spec, err)
			continue
		}
		if home != tt.home {
			t.Errorf("lookupUser(%q) home = %q, want %q", tt.spec, home, tt.home)
		}
		if tt.wantNil {
			if cred != nil {
				t.Errorf("lookupUser(%q) credential = %+v, want nil", tt.spec, cred)
			}
			continue
		}
		if cred == nil {
			t.Errorf("lookupUser(%q) credential = nil, want uid %d gid %d", tt.spec, tt.uid, tt.gid)
			continue
		}
		if cred.Uid != tt.uid || cred.Gid != tt.gid {
			t.Errorf("lookupUser(%q) = uid %d gid %d, want uid %d gid %d", tt.spec, cred.Uid, cred.Gid, tt.uid, tt.gid)
		}
		if slices.Contains(cred.Groups, cred.Gid) {
			t.Errorf("lookupUser(%q) supplementary groups %v repeat the primary group %d", tt.spec, cred.Groups, cred.Gid)
		}
	}
}

func TestLookupUserErrors(t *testing.T) {
	tests := []struct {
		spec    string
		wantErr string
	}{
		{"nosuchuser", `user "nosuchuser" is not in the sandbox's /etc/passwd`},
		{"nosuchuser:0", `user "nosuchuser"`},
		{"root:nosuchgroup", `group "nosuchgroup" is not in the sandbox's /etc/group`},
		{"-1", `user "-1"`},
		{"99999999999", `user "99999999999"`}, // does not fit in 32 bits
		{"root:", `group ""`},
	}
	for _, tt := range tests {
		cred, home, err := lookupUser(tt.spec)
		if err == nil {
			t.Errorf("lookupUser(%q) = %+v, %q, nil; want an error", tt.spec, cred, home)
			continue
		}
		if !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("lookupUser(%q) error = %q, want it to contain %q", tt.spec, err, tt.wantErr)
		}
	}
}

// TestReadColonFileBounded: the sandbox controls /etc/passwd and
// /etc/group; a lookup neither waits on one that is a FIFO nor reads one
// past maxColonFile.
func TestReadColonFileBounded(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	far := strings.Repeat("#"+strings.Repeat("x", 1000)+"\n", maxColonFile/1000) + "far:x:7:7::/far:/bin/sh\n"
	if err := os.WriteFile(big, []byte("near:x:6:6::/near:/bin/sh\n"+far), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path string
		want []string
	}{
		{fifo, nil},
		{"/dev/zero", nil},
		{big, []string{"near"}},
	}
	for _, tt := range tests {
		done := make(chan []string, 1)
		go func() {
			var got []string
			readColonFile(tt.path, func(f []string) bool {
				got = append(got, f[0])
				return false
			})
			done <- got
		}()
		select {
		case got := <-done:
			if !slices.Equal(got, tt.want) {
				t.Errorf("readColonFile(%s) read entries %q, want %q", tt.path, got, tt.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("readColonFile(%s) still reading after 10s", tt.path)
		}
	}
}

// etcIn writes passwd and group files into a directory of the test's own
// ("" : no such file) and returns them as the databases of a lookup.
func etcIn(t *testing.T, passwd, group string) etcFiles {
	t.Helper()
	dir := t.TempDir()
	e := etcFiles{passwd: filepath.Join(dir, "passwd"), group: filepath.Join(dir, "group")}
	for path, text := range map[string]string{e.passwd: passwd, e.group: group} {
		if text == "" {
			continue
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// The edges of a sandbox's own /etc/passwd and /etc/group: none at all,
// one that is not a file, a home with a NUL, a line past maxColonLine,
// a user in more groups than the kernel takes.
func TestLookupUserEtcEdges(t *testing.T) {
	const users = "root:x:0:0:root:/root:/bin/sh\nbob:x:1000:1000::/home/bob:/bin/sh\n"
	long := strings.Repeat("x", maxColonLine+100)
	var many strings.Builder
	for n := 2000; n < 2000+ngroupsMax+100; n++ {
		fmt.Fprintf(&many, "g%d:x:%d:bob\n", n, n)
	}
	dirEtc := etcFiles{passwd: t.TempDir(), group: t.TempDir()} // directories: unreadable as files
	tests := []struct {
		name     string
		etc      etcFiles
		spec     string
		uid, gid uint32
		home     string
		groups   int    // how many supplementary groups
		wantErr  string // part of the error; "" for none
	}{
		{name: "root, no passwd", etc: etcIn(t, "", ""), spec: "", home: "/root"},
		{name: "uid 0, no passwd", etc: etcIn(t, "", ""), spec: "0", home: "/root"},
		{name: "uid 0:0, no passwd", etc: etcIn(t, "", ""), spec: "0:0", home: "/root"},
		{name: "another uid, no passwd", etc: etcIn(t, "", ""), spec: "4242", uid: 4242, gid: 4242, home: "/"},
		{name: "root by name, no passwd", etc: etcIn(t, "", ""), spec: "root", wantErr: `user "root" is not in the sandbox's /etc/passwd`},
		{name: "root, passwd not a file", etc: dirEtc, spec: "", home: "/root"},
		{name: "uid 0, passwd not a file", etc: dirEtc, spec: "0", home: "/root"},
		{name: "root's own empty home", etc: etcIn(t, "root:x:0:0:root::/bin/sh\n", ""), spec: "", home: "/"},
		{name: "a home with a NUL", etc: etcIn(t, users+"nul:x:1001:1001::/home/a\x00b:/bin/sh\n", ""), spec: "nul", uid: 1001, gid: 1001, home: "/"},
		{name: "a NUL elsewhere", etc: etcIn(t, users+"nul:x:1001:1001:a\x00b:/home/nul:/bin/sh\n", ""), spec: "1001", uid: 1001, gid: 1001, home: "/home/nul"},
		{name: "past a line too long", etc: etcIn(t, long+"\n"+users, ""), spec: "bob", uid: 1000, gid: 1000, home: "/home/bob"},
		{name: "past an entry too long", etc: etcIn(t, "long:x:7:7::/"+long+":/bin/sh\n"+users, ""), spec: "bob", uid: 1000, gid: 1000, home: "/home/bob"},
		{name: "the long entry is none", etc: etcIn(t, "long:x:7:7::/"+long+":/bin/sh\n"+users, ""), spec: "long", wantErr: `user "long" is not in`},
		{name: "a long line last, unended", etc: etcIn(t, users+long, ""), spec: "bob", uid: 1000, gid: 1000, home: "/home/bob"},
		{name: "groups past a line too long", etc: etcIn(t, users, long+"\nstaff:x:50:bob\nwheel:x:10:alice,bob\n"), spec: "bob", uid: 1000, gid: 1000, home: "/home/bob", groups: 2},
		{name: "more groups than the kernel takes", etc: etcIn(t, users, many.String()), spec: "bob", uid: 1000, gid: 1000, home: "/home/bob", groups: ngroupsMax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cred, home, err := tt.etc.lookupUser(tt.spec)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("lookupUser(%q) = %+v, %q, %v; want an error with %q", tt.spec, cred, home, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("lookupUser(%q): %v", tt.spec, err)
			}
			if home != tt.home {
				t.Errorf("lookupUser(%q) home = %q, want %q", tt.spec, home, tt.home)
			}
			if tt.spec == "" {
				if cred != nil {
					t.Errorf("lookupUser(\"\") credential = %+v, want none", cred)
				}
				return
			}
			if cred == nil {
				t.Fatalf("lookupUser(%q): no credential", tt.spec)
			}
			if cred.Uid != tt.uid || cred.Gid != tt.gid || len(cred.Groups) != tt.groups {
				t.Fatalf("lookupUser(%q) = uid %d gid %d and %d groups, want uid %d gid %d and %d groups", tt.spec, cred.Uid, cred.Gid, len(cred.Groups), tt.uid, tt.gid, tt.groups)
			}
		})
	}
}

// readColonFile reads on past an over-long line, to the file's bound.
func TestReadColonFileLongLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	text := "a:1\n" + strings.Repeat("y", 3*maxColonLine) + "\nb:2\r\n" + strings.Repeat("z", maxColonLine-1) + "\nc:3"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var got []string
	readColonFile(path, func(f []string) bool {
		if len(f[0]) > 10 {
			f[0] = fmt.Sprintf("%c*%d", f[0][0], len(f[0]))
		}
		got = append(got, strings.Join(f, ":"))
		return false
	})
	want := []string{"a:1", "b:2", fmt.Sprintf("z*%d", maxColonLine-1), "c:3"}
	if !slices.Equal(got, want) {
		t.Errorf("readColonFile read %q, want %q", got, want)
	}
}
