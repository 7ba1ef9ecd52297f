package integration

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"golang.org/x/sys/unix"
)

func readAll(t *testing.T, sb, p string) []byte {
	t.Helper()
	rc, _, err := need(t).c.ReadFile(ctxT(t), sb, p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return b
}

func writeOK(t *testing.T, sb, p string, data []byte, o *client.WriteFileOptions) *client.WriteResult {
	t.Helper()
	res, err := need(t).c.WriteFile(ctxT(t), sb, p, bytes.NewReader(data), o)
	if err != nil {
		t.Fatalf("write %s: %v", p, err)
	}
	return res
}

// TestFilesRoundTrip: on both providers, files written through the API
// are seen by the sandbox's own commands at once and read back the same
// (a binary file too); a replaced file keeps its mode; what a command
// wrote is read at once; a listing, a stat, a removal (refused for a full
// directory without recursive); the ledger has the writes and the
// removal; bad paths get their codes. Then the sandbox is stopped and the
// same works on its files, with nothing left mounted, and a start sees
// what was written while it was stopped.
func TestFilesRoundTrip(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "files-" + prov})
			res := writeOK(t, sb.ID, "/root/a/b.txt", []byte("hello\n"), &client.WriteFileOptions{Parents: true})
			if res.Bytes != 6 || res.Path != "/root/a/b.txt" {
				t.Fatalf("write: %+v", res)
			}
			if got := execOK(t, sb.ID, "cat", "/root/a/b.txt"); got != "hello\n" {
				t.Fatalf("the sandbox reads %q", got)
			}
			bin := make([]byte, 3<<20+17)
			rand.Read(bin)
			mode := uint32(0o751)
			writeOK(t, sb.ID, "/root/a/bin", bin, &client.WriteFileOptions{Mode: &mode})
			if got := readAll(t, sb.ID, "/root/a/bin"); !bytes.Equal(got, bin) {
				t.Fatalf("read back %d bytes, differing from the %d written", len(got), len(bin))
			}
			if got := execOK(t, sb.ID, "sh", "-c", "stat -c %a:%s /root/a/bin"); got != "751:3145745\n" {
				t.Fatalf("the sandbox sees %q", got)
			}
			// A replaced file keeps its mode and owner.
			execOK(t, sb.ID, "sh", "-c", "chmod 600 /root/a/b.txt && chown 7:8 /root/a/b.txt")
			writeOK(t, sb.ID, "/root/a/b.txt", []byte("again\n"), nil)
			if got := execOK(t, sb.ID, "stat", "-c", "%a %u:%g", "/root/a/b.txt"); got != "600 7:8\n" {
				t.Fatalf("the replaced file is %q, want 600 7:8", got)
			}
			// What a command writes is read at once (the Sentry's view).
			execOK(t, sb.ID, "sh", "-c", "echo from-inside > /root/a/inside")
			if got := string(readAll(t, sb.ID, "/root/a/inside")); got != "from-inside\n" {
				t.Fatalf("read %q", got)
			}
			fi, err := e.c.StatFile(ctxT(t), sb.ID, "/root/a", false)
			if err != nil || fi.Type != "dir" {
				t.Fatalf("stat: %+v %v", fi, err)
			}
			list, err := e.c.ListFiles(ctxT(t), sb.ID, "/root/a")
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, en := range list.Entries {
				names = append(names, en.Name)
			}
			if strings.Join(names, " ") != "b.txt bin inside" {
				t.Fatalf("list: %v", names)
			}

			_, _, err = e.c.ReadFile(ctxT(t), sb.ID, "/root/a")
			wantCode(t, "a raw read of a directory", err, 400, "is_a_directory", "/root/a")
			_, err = e.c.StatFile(ctxT(t), sb.ID, "/root/nope", false)
			wantCode(t, "a missing file", err, 404, "file_not_found", "/root/nope")
			_, err = e.c.StatFile(ctxT(t), sb.ID, "root/a", false)
			wantCode(t, "a relative path", err, 400, "invalid_path", "absolute")
			_, err = e.c.RemoveFile(ctxT(t), sb.ID, "/root/a", false)
			wantCode(t, "removing a full directory", err, 409, "directory_not_empty", "recursive")
			_, err = e.c.WriteFile(ctxT(t), sb.ID, "/root/no/such/dir/f", strings.NewReader("x"), nil)
			wantCode(t, "a write without its directory", err, 404, "file_not_found", "/root/no/such/dir")

			// Stopped: the same calls, on its files.
			if _, err := e.c.Stop(ctxT(t), sb.ID); err != nil {
				t.Fatal(err)
			}
			writeOK(t, sb.ID, "/root/a/while-stopped", []byte("stopped\n"), nil)
			if got := string(readAll(t, sb.ID, "/root/a/bin")); got != string(bin) {
				t.Fatal("a stopped sandbox's file reads differently")
			}
			if _, err := e.c.RemoveFile(ctxT(t), sb.ID, "/root/a/inside", false); err != nil {
				t.Fatal(err)
			}
			mounts, _ := os.ReadFile("/proc/self/mounts")
			if strings.Contains(string(mounts), sb.ID+"/files") {
				t.Fatalf("a stopped sandbox's files stay mounted:\n%s", mounts)
			}
			if _, err := e.c.Start(ctxT(t), sb.ID); err != nil {
				t.Fatal(err)
			}
			if got := execOK(t, sb.ID, "sh", "-c", "cat /root/a/while-stopped; ls /root/a"); got != "stopped\nb.txt\nbin\nwhile-stopped\n" {
				t.Fatalf("after the start: %q", got)
			}
			if _, err := e.c.RemoveFile(ctxT(t), sb.ID, "/root/a", true); err != nil {
				t.Fatal(err)
			}
			if got := execOK(t, sb.ID, "ls", "/root"); got != "" {
				t.Fatalf("/root holds %q after a recursive remove", got)
			}

			page, err := e.c.Events(ctxT(t), sb.Name, 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			var writes, removes int
			for _, ev := range page.Events {
				switch ev.Type {
				case "sandbox.files_written":
					writes++
				case "sandbox.files_removed":
					removes++
					var d struct {
						Path      string `json:"path"`
						Recursive bool   `json:"recursive"`
					}
					json.Unmarshal(ev.Data, &d)
					if d.Path == "/root/a" && !d.Recursive {
						t.Errorf("the recursive removal is recorded as %s", ev.Data)
					}
				}
			}
			if writes != 4 || removes != 2 {
				t.Fatalf("the ledger has %d writes and %d removals, want 4 and 2", writes, removes)
			}
		})
	}
}

// TestFilesStayInTheSandbox: no path, symlink or archive entry a sandbox
// controls reaches a host file. A sentinel on the host is never touched:
// not by a path with "..", nor through a symlink the sandbox made to the
// sentinel's host path (the write lands in the sandbox), nor by an archive
// whose entries climb out or go through a symlink; running and stopped.
// A copy out to the host of a sandbox's symlink keeps it a symlink, never
// follows it, and drops a setuid bit.
func TestFilesStayInTheSandbox(t *testing.T) {
	e := need(t)
	hostDir := t.TempDir()
	sentinel := filepath.Join(hostDir, "sentinel")
	os.WriteFile(sentinel, []byte("host"), 0o644)
	intact := func(when string) {
		t.Helper()
		if b, err := os.ReadFile(sentinel); err != nil || string(b) != "host" {
			t.Fatalf("%s: the host's sentinel is %q (%v)", when, b, err)
		}
		if ents, _ := os.ReadDir(hostDir); len(ents) != 1 {
			t.Fatalf("%s: the host dir holds %d entries", when, len(ents))
		}
	}
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "files-hostile-" + prov})
			execOK(t, sb.ID, "sh", "-c", "mkdir -p /srv && ln -s "+hostDir+" /srv/host && ln -s / /srv/root && ln -s ../../../../.. /srv/up")
			for round, stopped := range []bool{false, true} {
				if stopped {
					if _, err := e.c.Stop(ctxT(t), sb.ID); err != nil {
						t.Fatal(err)
					}
				}
				for _, p := range []string{
					"/../../../../../.." + sentinel,
					"/srv/host/sentinel",
					"/srv/root" + sentinel,
					"/srv/up" + sentinel,
				} {
					if _, err := e.c.WriteFile(ctxT(t), sb.ID, p, strings.NewReader("sandbox"), &client.WriteFileOptions{Parents: true}); err != nil {
						t.Fatalf("write %s: %v", p, err)
					}
					intact("after a write to " + p)
					if got := string(readAll(t, sb.ID, p)); got != "sandbox" {
						t.Fatalf("%s reads %q in the sandbox", p, got)
					}
				}
				var tb bytes.Buffer
				tw := newTar(&tb)
				tw.symlink("esc", hostDir)
				tw.file("esc/sentinel", "owned")
				tw.close()
				_, err := e.c.WriteArchive(ctxT(t), sb.ID, "/srv/dst", &tb)
				wantCode(t, "an entry through a symlink out", err, 400, "unsafe_archive", "esc/sentinel")
				tb.Reset()
				tw = newTar(&tb)
				tw.file("../../../.."+sentinel, "owned")
				tw.close()
				_, err = e.c.WriteArchive(ctxT(t), sb.ID, "/srv/dst2", &tb)
				wantCode(t, "an entry with ..", err, 400, "unsafe_archive", "..")
				intact("after the archives")
				if round == 0 {
					// The write through /srv/host landed in the sandbox,
					// where the link names.
					if got := execOK(t, sb.ID, "cat", hostDir+"/sentinel"); got != "sandbox" {
						t.Fatalf("the sandbox's own %s/sentinel is %q", hostDir, got)
					}
				}
			}
			if _, err := e.c.Start(ctxT(t), sb.ID); err != nil {
				t.Fatal(err)
			}
			// Out to the host: the links stay links, the setuid bit goes.
			execOK(t, sb.ID, "sh", "-c", "mkdir -p /srv/out && ln -s /etc /srv/out/etc && ln -s "+hostDir+" /srv/out/host && echo x > /srv/out/suid && chmod 4755 /srv/out/suid")
			local := t.TempDir()
			_, errOut, code := e.cli(t, "", "cp", sb.ID+":/srv/out", local)
			if code != 0 {
				t.Fatalf("cp out: exit %d: %s", code, errOut)
			}
			if !strings.Contains(errOut, "setuid") {
				t.Errorf("cp out said nothing of the setuid bit: %q", errOut)
			}
			for name, target := range map[string]string{"etc": "/etc", "host": hostDir} {
				if l, err := os.Readlink(filepath.Join(local, "out", name)); err != nil || l != target {
					t.Fatalf("out/%s: %q %v, want a symlink to %s", name, l, err, target)
				}
			}
			if fi, err := os.Stat(filepath.Join(local, "out", "suid")); err != nil || fi.Mode()&os.ModeSetuid != 0 {
				t.Fatalf("out/suid: %v %v", fi.Mode(), err)
			}
			intact("after the copy out")
		})
	}
}

// TestFilesCopyCLI: shard cp both ways with docker's semantics, keeping
// mode, owner and modification time, symlinks as symlinks; shard write
// and cat; shard ls.
func TestFilesCopyCLI(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "files-cli-" + prov})
			src := filepath.Join(t.TempDir(), "proj")
			os.MkdirAll(filepath.Join(src, "sub"), 0o750)
			os.WriteFile(filepath.Join(src, "a.txt"), []byte("a\n"), 0o640)
			os.WriteFile(filepath.Join(src, "sub", "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755)
			os.Symlink("a.txt", filepath.Join(src, "link"))
			os.Chown(filepath.Join(src, "a.txt"), 1234, 5678)
			old := time.Date(2020, 5, 6, 7, 8, 9, 0, time.UTC)
			os.Chtimes(filepath.Join(src, "a.txt"), old, old)

			run := func(stdin string, args ...string) string {
				t.Helper()
				out, errOut, code := e.cli(t, stdin, args...)
				if code != 0 {
					t.Fatalf("shard %v: exit %d: %s", args, code, errOut)
				}
				return out
			}
			execOK(t, sb.ID, "mkdir", "/srv")
			run("", "cp", src, sb.Name+":/srv/")
			got := execOK(t, sb.ID, "sh", "-c", "cd /srv/proj && stat -c '%n %a %u:%g %Y' a.txt sub sub/run.sh && readlink link && sub/run.sh")
			want := "a.txt 640 1234:5678 " + strconv.FormatInt(old.Unix(), 10) + "\nsub 750 0:0 "
			if !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "a.txt\nran\n") {
				t.Fatalf("in the sandbox:\n%s\nwant it to start %q", got, want)
			}
			// A directory to a name that does not exist: its contents.
			run("", "cp", src, sb.Name+":/srv/renamed")
			// Contents of a directory into an existing one.
			run("", "cp", src+"/.", sb.Name+":/tmp")
			if got := execOK(t, sb.ID, "sh", "-c", "ls /srv/renamed; ls /tmp"); got != "a.txt\nlink\nsub\na.txt\nlink\nsub\n" {
				t.Fatalf("after the copies: %q", got)
			}
			// A file onto a file; to a directory that does not exist.
			run("", "cp", filepath.Join(src, "sub", "run.sh"), sb.Name+":/srv/proj/a.txt")
			if got := execOK(t, sb.ID, "stat", "-c", "%a", "/srv/proj/a.txt"); got != "755\n" {
				t.Fatalf("a.txt after a file was copied onto it: mode %q", got)
			}
			if _, errOut, code := e.cli(t, "", "cp", filepath.Join(src, "a.txt"), sb.Name+":/nowhere/"); code == 0 || !strings.Contains(errOut, "does not exist") {
				t.Fatalf("cp to a missing directory: exit %d: %s", code, errOut)
			}
			// A file is copied without asking the sandbox first (DEST/),
			// or asking once (DEST): into a directory, by name, or not
			// at all when the directory is missing or a file.
			run("", "cp", filepath.Join(src, "sub", "run.sh"), sb.Name+":/srv/proj/sub/")
			run("", "cp", filepath.Join(src, "sub", "run.sh"), sb.Name+":/srv/renamed")
			run("", "cp", filepath.Join(src, "sub", "run.sh"), sb.Name+":/srv/proj/sub/again.sh")
			if got := execOK(t, sb.ID, "sh", "-c", "/srv/proj/sub/run.sh && /srv/renamed/run.sh && /srv/proj/sub/again.sh"); got != "ran\nran\nran\n" {
				t.Fatalf("files copied into directories: %q", got)
			}
			if _, errOut, code := e.cli(t, "", "cp", filepath.Join(src, "a.txt"), sb.Name+":/nowhere/x"); code == 0 || !strings.Contains(errOut, "directory "+sb.Name+":/nowhere does not exist: make it first") {
				t.Fatalf("cp to a name in a missing directory: exit %d: %s", code, errOut)
			}
			if _, errOut, code := e.cli(t, "", "cp", filepath.Join(src, "a.txt"), sb.Name+":/srv/proj/a.txt/"); code == 0 || !strings.Contains(errOut, "not a directory") {
				t.Fatalf("cp into a file as a directory: exit %d: %s", code, errOut)
			}
			// And out again.
			dst := t.TempDir()
			run("", "cp", sb.Name+":/srv/renamed", dst)
			run("", "cp", sb.Name+":/srv/renamed/a.txt", filepath.Join(dst, "single"))
			fi, err := os.Stat(filepath.Join(dst, "renamed", "a.txt"))
			if err != nil || fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(old) || fi.Sys().(*syscall.Stat_t).Uid != 1234 {
				t.Fatalf("out: %v %v %v", fi.Mode(), fi.ModTime(), err)
			}
			if l, err := os.Readlink(filepath.Join(dst, "renamed", "link")); err != nil || l != "a.txt" {
				t.Fatalf("out: link %q %v", l, err)
			}
			if b, err := os.ReadFile(filepath.Join(dst, "single")); err != nil || string(b) != "a\n" {
				t.Fatalf("single: %q %v", b, err)
			}
			// A tar both ways through -.
			tarOut := run("", "cp", sb.Name+":/srv/proj/sub", "-")
			run(tarOut, "cp", "-", sb.Name+":/from-tar")
			if got := execOK(t, sb.ID, "/from-tar/sub/run.sh"); got != "ran\n" {
				t.Fatalf("from a tar: %q", got)
			}
			// write, cat, ls.
			run("some text", "write", "--parents", "--mode", "600", sb.Name, "/w/x.txt")
			if got := run("", "cat", sb.Name, "/w/x.txt"); got != "some text" {
				t.Fatalf("cat: %q", got)
			}
			if got := run("", "ls", sb.Name, "/w"); !strings.HasPrefix(got, "-rw-------") || !strings.Contains(got, "x.txt") {
				t.Fatalf("ls: %q", got)
			}
			if _, errOut, code := e.cli(t, "", "cat", sb.Name, "/w"); code == 0 || !strings.Contains(errOut, "is a directory") {
				t.Fatalf("cat of a directory: exit %d: %s", code, errOut)
			}
		})
	}
}

// TestFilesDiskFull: a write past the sandbox's disk bound is 507
// disk_full naming the bound; nothing of it is kept, and the sandbox and
// its files work on.
func TestFilesDiskFull(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "files-full-" + prov, Disk: jsonRaw("64MiB")})
			before := execOK(t, sb.ID, "sh", "-c", "df -k / | tail -1 | awk '{print $3}'")
			_, err := e.c.WriteFile(ctxT(t), sb.ID, "/big", io.LimitReader(rand.Reader, 100<<20), nil)
			wantCode(t, "a write past the disk", err, 507, "disk_full", "64MiB")
			after := execOK(t, sb.ID, "sh", "-c", "df -k / | tail -1 | awk '{print $3}'")
			if before != after {
				t.Errorf("the disk holds %s KiB after the refused write, %s before", strings.TrimSpace(after), strings.TrimSpace(before))
			}
			if got := execOK(t, sb.ID, "sh", "-c", "ls -A / | grep -c shard-write || true"); got != "0\n" {
				t.Errorf("a half-written file is left: %q", got)
			}
			writeOK(t, sb.ID, "/after", bytes.Repeat([]byte("y"), 1<<20), nil)
			execOK(t, sb.ID, "sh", "-c", "echo ok > /root/ok")
		})
	}
}

// TestFilesStoreFull: a write that the sandbox store cannot hold (it is
// full: the sandbox's own disk has room, the store under it has none) is
// refused, and the file it would have replaced reads as it was: running
// and stopped, on both providers, one file and a tar. It was acknowledged
// before, and then read back as zeros of the right size once the page
// cache let go of it (a stopped sandbox's at once, when its files were
// unmounted): the helper left the bytes in the page cache and the store
// failed their writeback. Inside gVisor this needs runsc's fsync to report
// the host's error (tools/runsc/patches/0004).
func TestFilesStoreFull(t *testing.T) {
	e := need(t)
	old, data := bytes.Repeat([]byte("old\n"), 1<<10), make([]byte, 8<<20)
	rand.Read(data)
	for _, prov := range providers {
		for _, state := range []string{"running", "stopped"} {
			t.Run(prov+"/"+state, func(t *testing.T) {
				sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "files-store-full-" + prov + "-" + state})
				writeOK(t, sb.ID, "/root/f.bin", old, nil)
				var arch bytes.Buffer
				tb := newTar(&arch)
				tb.file("t/a.bin", string(data))
				tb.close()
				if state == "stopped" {
					if _, err := e.c.Stop(ctxT(t), sb.ID); err != nil {
						t.Fatal(err)
					}
				}
				unfill := fillStore(t, sb.ID)
				_, werr := e.c.WriteFile(ctxT(t), sb.ID, "/root/f.bin", bytes.NewReader(data), nil)
				_, terr := e.c.WriteArchive(ctxT(t), sb.ID, "/root", bytes.NewReader(arch.Bytes()))
				// Whatever the page cache holds of them is written back
				// now, while the store is full, and let go of.
				upper := filepath.Join(e.dataDir, "storage", "mnt", sb.ID)
				if f, err := os.Open(upper); err == nil {
					unix.Syncfs(int(f.Fd()))
					f.Close()
					for _, p := range []string{"root/f.bin", "root/t/a.bin"} {
						if f, err := os.Open(filepath.Join(upper, "upper", p)); err == nil {
							unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
							f.Close()
						}
					}
				}
				unfill()
				if werr == nil {
					t.Errorf("a write into a full store was acknowledged")
				}
				if got := readAll(t, sb.ID, "/root/f.bin"); !bytes.Equal(got, old) {
					t.Errorf("the file reads as %d bytes (%d of them zeros), not the %d it held before the refused write", len(got), bytes.Count(got, []byte{0}), len(old))
				}
				if terr == nil {
					if got := readAll(t, sb.ID, "/root/t/a.bin"); !bytes.Equal(got, data) {
						t.Errorf("a tar unpacked into a full store was acknowledged, and its file reads as %d bytes (%d of them zeros)", len(got), bytes.Count(got, []byte{0}))
					}
				}
				t.Logf("refused: %v; the tar: %v", werr, terr)
			})
		}
	}
}

// fillStore takes all the sandbox store's free space (a file beside the
// sandboxes' images), after sandbox sb's writes so far are in it; the
// function it returns gives the space back.
func fillStore(t *testing.T, sb string) func() {
	t.Helper()
	store := filepath.Join(need(t).dataDir, "storage")
	for _, dir := range []string{filepath.Join(store, "mnt", sb), store} {
		if f, err := os.Open(dir); err == nil {
			unix.Syncfs(int(f.Fd()))
			f.Close()
		}
	}
	filler := filepath.Join(store, "fill-"+sb)
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Statfs(store, &st); err != nil {
		t.Fatal(err)
	}
	for n := int64(st.Bavail) * int64(st.Bsize); n > 0; n -= 256 << 10 {
		if unix.Fallocate(int(f.Fd()), 0, 0, n) == nil {
			break
		}
	}
	unfill := func() { os.Remove(filler) }
	t.Cleanup(unfill)
	return unfill
}

// tarBuilder writes a test archive.
type tarBuilder struct{ tw *tar.Writer }

func newTar(w io.Writer) *tarBuilder { return &tarBuilder{tar.NewWriter(w)} }

func (b *tarBuilder) file(name, body string) {
	b.tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
	io.WriteString(b.tw, body)
}

func (b *tarBuilder) symlink(name, target string) {
	b.tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777})
}

func (b *tarBuilder) close() { b.tw.Close() }

// TestFilesCutUpload: an upload whose client goes away halfway writes
// nothing, leaves no helper behind, and (stopped) does not keep the
// sandbox from starting.
func TestFilesCutUpload(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		for _, stopped := range []bool{false, true} {
			name := prov
			if stopped {
				name += "-stopped"
			}
			t.Run(name, func(t *testing.T) {
				sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "files-cut-" + name})
				if stopped {
					if _, err := e.c.Stop(ctxT(t), sb.ID); err != nil {
						t.Fatal(err)
					}
				}
				pr, pw := io.Pipe()
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() {
					_, err := e.c.WriteFile(ctx, sb.ID, "/root/cut", pr, nil)
					done <- err
				}()
				pw.Write(bytes.Repeat([]byte("x"), 3<<20))
				cancel() // the client goes away mid-upload
				// Its body breaks off too: a plain Close ended it well, and
				// the transport, racing the cancel, could send the body's
				// end, a whole upload the server rightly wrote.
				pw.CloseWithError(errors.New("the client went away"))
				if err := <-done; err == nil {
					t.Fatal("a cut upload succeeded")
				}
				deadline := time.Now().Add(20 * time.Second)
				for {
					out, _ := exec.Command("pgrep", "-f", "files-helper put /root/cut").Output()
					if len(bytes.TrimSpace(out)) == 0 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("a files helper is left: %s", out)
					}
					time.Sleep(100 * time.Millisecond)
				}
				if stopped {
					if _, err := e.c.Start(ctxT(t), sb.ID); err != nil {
						t.Fatalf("start after a cut upload: %v", err)
					}
				}
				if got := execOK(t, sb.ID, "sh", "-c", "ls -A /root"); got != "" {
					t.Fatalf("/root holds %q after a cut upload", got)
				}
			})
		}
	}
}

// TestFilesSecretsNeedWrite: a key with sandbox:read lists and stats a
// sandbox's files, and reads those of one without grants; the contents of
// one that holds a secret grant (the granted file, or any other) need
// sandbox:write, as only those who can exec see a secret's value.
func TestFilesSecretsNeedWrite(t *testing.T) {
	e := need(t)
	if _, err := e.c.SetSecret(ctxT(t), "FILES_SECRET", []byte("top-secret-value")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.RemoveSecret(context.Background(), "FILES_SECRET") })
	plain := create(t, client.CreateRequest{Image: busybox, Name: "files-plain"})
	granted := create(t, client.CreateRequest{Image: busybox, Name: "files-granted"})
	if _, err := e.c.Grant(ctxT(t), granted.ID, client.Grant{Secret: "FILES_SECRET", File: "/run/secrets/s"}); err != nil {
		t.Fatal(err)
	}
	ro, err := client.New(client.Options{Remote: "http://" + e.tcp, APIKey: token(t, "files-ro", "sandbox:read")})
	if err != nil {
		t.Fatal(err)
	}
	if rc, _, err := ro.ReadFile(ctxT(t), plain.ID, "/etc/passwd"); err != nil {
		t.Fatalf("a read-only key reads a sandbox without grants: %v", err)
	} else {
		rc.Close()
	}
	_, _, err = ro.ReadFile(ctxT(t), granted.ID, "/run/secrets/s")
	wantCode(t, "a read-only key reading a granted file", err, 403, "missing_scope", "sandbox:write")
	_, _, err = ro.ReadArchive(ctxT(t), granted.ID, "/run", false)
	wantCode(t, "a read-only key reading a tar of it", err, 403, "missing_scope", "sandbox:write")
	if _, err := ro.StatFile(ctxT(t), granted.ID, "/run/secrets/s", false); err != nil {
		t.Fatalf("stat: %v", err)
	}
	_, err = ro.Diff(ctxT(t), granted.ID, "", true)
	wantCode(t, "a read-only key's patch of it", err, 403, "missing_scope", "sandbox:write")
	if _, err := ro.Diff(ctxT(t), granted.ID, "", false); err != nil {
		t.Fatalf("a diff without patches: %v", err)
	}
}

// TestFilesStalledUpload: an upload whose body stalls past --body-timeout
// is 400 short_body, saying the upload broke off, and writes nothing; it
// was 422 files_helper_failed, "the files helper gave no answer: read |0:
// file already closed", with a hint about older sandboxes.
func TestFilesStalledUpload(t *testing.T) {
	e := need(t)
	restartWith(t, "--body-timeout", "2s")
	for _, prov := range providers {
		for _, stopped := range []bool{false, true} {
			name := prov
			if stopped {
				name += "-stopped"
			}
			t.Run(name, func(t *testing.T) {
				sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "files-stall-" + name})
				if stopped {
					if _, err := e.c.Stop(ctxT(t), sb.ID); err != nil {
						t.Fatal(err)
					}
				}
				conn, err := net.Dial("unix", e.socket)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				// 3 bytes of the 100 it says, then nothing.
				fmt.Fprintf(conn, "PUT /v0/sandboxes/%s/files?path=/root/stall HTTP/1.1\r\nHost: shard\r\nContent-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\nabc", sb.ID)
				conn.SetReadDeadline(time.Now().Add(time.Minute))
				resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				var apiErr struct{ Code, Message string }
				json.Unmarshal(body, &apiErr)
				if resp.StatusCode != 400 || apiErr.Code != client.CodeShortBody || !strings.Contains(apiErr.Message, "broke off") {
					t.Errorf("a stalled upload: %d %s, want 400 short_body saying it broke off", resp.StatusCode, body)
				}
				if stopped {
					if _, err := e.c.Start(ctxT(t), sb.ID); err != nil {
						t.Fatal(err)
					}
				}
				if got := execOK(t, sb.ID, "sh", "-c", "ls -A /root"); got != "" {
					t.Errorf("/root holds %q after a stalled upload", got)
				}
			})
		}
	}
}
