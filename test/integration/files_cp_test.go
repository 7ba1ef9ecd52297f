package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// TestFilesCopyFollowsDirLink: as docker cp, a sandbox path that ends in
// / or /. and names a symlink to a directory copies the directory (its
// contents with /.), both ways, running and stopped; without them the
// link is copied as a link. The link is resolved in the sandbox's root:
// one to a path that is a directory on the host too copies the sandbox's.
func TestFilesCopyFollowsDirLink(t *testing.T) {
	e := need(t)
	hostDir := t.TempDir()
	os.WriteFile(filepath.Join(hostDir, "marker"), []byte("host"), 0o644)
	os.WriteFile(filepath.Join(hostDir, "host-only"), []byte("host"), 0o644)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "files-dirlink-" + prov})
			execOK(t, sb.ID, "sh", "-c", "mkdir -p /t/real/sub /t/inreal "+hostDir+" && echo a > /t/real/a && echo b > /t/real/sub/b && ln -s real /t/lnkdir && ln -s inreal /t/lnkin && "+
				"echo sandbox > "+hostDir+"/marker && ln -s "+hostDir+" /t/hostlnk")
			run := func(args ...string) {
				t.Helper()
				if _, errOut, code := e.cli(t, "", args...); code != 0 {
					t.Fatalf("shard %v: exit %d: %s", args, code, errOut)
				}
			}
			for _, state := range []string{"running", "stopped"} {
				if state == "stopped" {
					if _, err := e.c.Stop(ctxT(t), sb.ID); err != nil {
						t.Fatal(err)
					}
				}
				local := t.TempDir()
				// /. : the contents of the directory the link names.
				run("cp", sb.Name+":/t/lnkdir/.", filepath.Join(local, "x"))
				wantTree(t, state+" lnkdir/.", filepath.Join(local, "x"), "a=a\nsub/b=b\n")
				// / : the directory, under the link's name.
				os.Mkdir(filepath.Join(local, "y"), 0o755)
				run("cp", sb.Name+":/t/lnkdir/", filepath.Join(local, "y"))
				wantTree(t, state+" lnkdir/", filepath.Join(local, "y"), "lnkdir/a=a\nlnkdir/sub/b=b\n")
				// Neither: the link itself.
				run("cp", sb.Name+":/t/lnkdir", filepath.Join(local, "z"))
				if l, err := os.Readlink(filepath.Join(local, "z")); err != nil || l != "real" {
					t.Fatalf("%s: lnkdir copied as %q %v, want the symlink", state, l, err)
				}
				// The sandbox's directory at the host's path, never the host's.
				run("cp", sb.Name+":/t/hostlnk/.", filepath.Join(local, "w"))
				wantTree(t, state+" hostlnk/.", filepath.Join(local, "w"), "marker=sandbox\n")
				// In: through the link into the directory it names.
				os.WriteFile(filepath.Join(local, "in-"+state), []byte(state+"\n"), 0o644)
				run("cp", filepath.Join(local, "in-"+state), sb.Name+":/t/lnkin/")
				run("cp", filepath.Join(local, "x")+"/.", sb.Name+":/t/lnkin/.")
			}
			if _, err := e.c.Start(ctxT(t), sb.ID); err != nil {
				t.Fatal(err)
			}
			if got := execOK(t, sb.ID, "sh", "-c", "readlink /t/lnkin; cat /t/inreal/in-running /t/inreal/in-stopped; ls /t/inreal"); got != "inreal\nrunning\nstopped\na\nin-running\nin-stopped\nsub\n" {
				t.Fatalf("after the copies in: %q", got)
			}
			if b, err := os.ReadFile(filepath.Join(hostDir, "marker")); err != nil || string(b) != "host" {
				t.Fatalf("the host's marker: %q %v", b, err)
			}
		})
	}
}

// wantTree checks the regular files under dir (name=content lines, sorted)
// and that dir and what it holds are no symlinks.
func wantTree(t *testing.T, what, dir, want string) {
	t.Helper()
	var got strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("%s is a symlink", p)
		}
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			rel, _ := filepath.Rel(dir, p)
			fmt.Fprintf(&got, "%s=%s", rel, b)
		}
		return nil
	})
	if err != nil || got.String() != want {
		t.Fatalf("%s: %q %v, want %q", what, got.String(), err, want)
	}
}

// smallDisk mounts a tmpfs of size on a new directory for the test: a copy
// that wrote a sparse file's holes would fill it at once.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// The sparse file of TestFilesCopySparse: 10 GiB, of which 3 MiB of data
// at two places; the regions it is checked by (MiB offset and count): the
// data, a hole, and the end.
const sparseSize = 10 << 30

var sparseRegions = [][2]int64{{100, 1}, {5000, 2}, {3000, 1}, {10239, 1}}

// regionsHere hashes the regions of the local file p.
func regionsHere(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out strings.Builder
	for _, r := range sparseRegions {
		h := sha256.New()
		if _, err := io.Copy(h, io.NewSectionReader(f, r[0]<<20, r[1]<<20)); err != nil {
			t.Fatal(err)
		}
		out.WriteString(hex.EncodeToString(h.Sum(nil)) + "\n")
	}
	return out.String()
}

// regionsThere hashes the regions of p in the sandbox.
func regionsThere(t *testing.T, sb, p string) string {
	t.Helper()
	var script strings.Builder
	for _, r := range sparseRegions {
		fmt.Fprintf(&script, "dd if=%s bs=1M skip=%d count=%d 2>/dev/null | sha256sum | cut -d' ' -f1; ", p, r[0], r[1])
	}
	return execOK(t, sb, "sh", "-c", script.String())
}

// sizeAndRoom is a local file's size and what it takes on its disk.
func sizeAndRoom(t *testing.T, p string) (size, room int64) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size(), fi.Sys().(*syscall.Stat_t).Blocks * 512
}

// diskUsed is what a sandbox's disk holds, in KiB, as its df says (inside
// gVisor a file's st_blocks is its size: its file system's count is true).
func diskUsed(t *testing.T, sb string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.TrimSpace(execOK(t, sb, "sh", "-c", "df -k / | tail -1 | awk '{print $3}'")), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFilesCopySparse: shard cp keeps a sparse file's holes both ways, and
// what a copy writes is the file's data, not its size: a file of 10 GiB
// with 3 MiB of data copies out to a tmpfs of 64 MiB and back into a
// sandbox whose disk is 512 MiB (taking there what its data takes), a
// file alone and in a directory, from a running sandbox and a stopped
// one, in seconds; its data and holes read the same at each end.
func TestFilesCopySparse(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "files-sparse-" + prov, Disk: jsonRaw("512MiB")})
			execOK(t, sb.ID, "sh", "-c", "mkdir -p /srv/dir && truncate -s 10G /srv/dir/sparse && "+
				"dd if=/dev/urandom of=/srv/dir/sparse bs=1M seek=100 count=1 conv=notrunc 2>/dev/null && "+
				"dd if=/dev/urandom of=/srv/dir/sparse bs=1M seek=5000 count=2 conv=notrunc 2>/dev/null")
			want := regionsThere(t, sb.ID, "/srv/dir/sparse")
			used := diskUsed(t, sb.ID)
			cp := func(args ...string) {
				t.Helper()
				start := time.Now()
				if _, errOut, code := e.cli(t, "", append([]string{"cp"}, args...)...); code != 0 {
					t.Fatalf("shard cp %v: exit %d: %s", args, code, errOut)
				}
				took := time.Since(start)
				t.Logf("cp %v: %v", args, took)
				if took > time.Minute {
					t.Errorf("cp %v took %v", args, took)
				}
			}
			var copiedIn []string
			for _, state := range []string{"running", "stopped"} {
				if state == "stopped" {
					if _, err := e.c.Stop(ctxT(t), sb.ID); err != nil {
						t.Fatal(err)
					}
				}
				local := smallDisk(t, "64m")
				cp(sb.Name+":/srv/dir/sparse", filepath.Join(local, "sparse"))
				cp(sb.Name+":/srv/dir", filepath.Join(local, "dir"))
				for _, p := range []string{filepath.Join(local, "sparse"), filepath.Join(local, "dir", "sparse")} {
					if size, room := sizeAndRoom(t, p); size != sparseSize || room > 8<<20 {
						t.Fatalf("%s: out to %s: %d bytes taking %d, want %d taking 3 MiB or so", state, p, size, room, int64(sparseSize))
					}
					if got := regionsHere(t, p); got != want {
						t.Fatalf("%s: out to %s: regions hash\n%s\nwant\n%s", state, p, got, want)
					}
				}
				cp(filepath.Join(local, "sparse"), sb.Name+":/srv/back-"+state)
				cp(filepath.Join(local, "dir"), sb.Name+":/srv/dir-"+state)
				copiedIn = append(copiedIn, "/srv/back-"+state, "/srv/dir-"+state+"/sparse")
			}
			if _, err := e.c.Start(ctxT(t), sb.ID); err != nil {
				t.Fatal(err)
			}
			for _, p := range copiedIn {
				if size := strings.TrimSpace(execOK(t, sb.ID, "stat", "-c", "%s", p)); size != strconv.Itoa(sparseSize) {
					t.Fatalf("in to %s: %s bytes", p, size)
				}
				if got := regionsThere(t, sb.ID, p); got != want {
					t.Fatalf("in to %s: regions hash\n%s\nwant\n%s", p, got, want)
				}
			}
			if grew := diskUsed(t, sb.ID) - used; grew > 32<<10 {
				t.Errorf("four copies in of 3 MiB of data took %d KiB of the sandbox's disk", grew)
			}
		})
	}
}

// sparseUpload is a tar of one sparse file of size bytes, its extents
// record ext, holding data: what shard cp sends, or a hostile sender.
func sparseUpload(t *testing.T, size int64, ext string, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	hdr := &tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data)), Format: tar.FormatPAX,
		PAXRecords: map[string]string{client.SparseSizeRecord: strconv.FormatInt(size, 10), client.SparseExtentsRecord: ext}}
	if err := tw.WriteHeader(hdr); err != nil {
		t.Fatal(err)
	}
	tw.Write(data)
	tw.Close()
	return b.Bytes()
}

// TestFilesSparseUploadChecked: a sparse upload's extents are whole blocks
// of 4 KiB: 2000 extents of a byte each, 4 KiB apart (2 KB sent, 8 MB of
// the sandbox's disk written before), are 400 bad_archive. A size past the
// largest file the sandbox's filesystem holds is 413 too_large, saying so
// (it was 422 io_error). Neither leaves anything. A good one reports, and
// records in the ledger, the data it wrote, not the file's size.
func TestFilesSparseUploadChecked(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "files-sparse-checked-" + prov})
			var ext strings.Builder
			for i := range 2000 {
				if i > 0 {
					ext.WriteString(",")
				}
				fmt.Fprintf(&ext, "%d:1", i*4096)
			}
			bomb := sparseUpload(t, 2000*4096, ext.String(), bytes.Repeat([]byte("b"), 2000))
			_, err := e.c.WriteSparseFile(ctxT(t), sb.ID, "/bomb", bytes.NewReader(bomb), nil)
			wantCode(t, "extents of a byte each", err, 400, "bad_archive", "not whole blocks")
			huge := sparseUpload(t, 1<<50, "0:4096", bytes.Repeat([]byte("h"), 4096))
			_, err = e.c.WriteSparseFile(ctxT(t), sb.ID, "/huge", bytes.NewReader(huge), nil)
			wantCode(t, "a file of 1 PiB", err, 413, "too_large", "past the largest file the filesystem holds")
			if got := execOK(t, sb.ID, "sh", "-c", "ls -A / | grep -c -e bomb -e huge -e shard-write || true"); got != "0\n" {
				t.Fatalf("the refused uploads left %s files", strings.TrimSpace(got))
			}

			good := sparseUpload(t, 1<<30, fmt.Sprintf("0:4096,%d:8192", 1<<29), bytes.Repeat([]byte("g"), 3*4096))
			res, err := e.c.WriteSparseFile(ctxT(t), sb.ID, "/good", bytes.NewReader(good), nil)
			if err != nil || res.Bytes != 3*4096 {
				t.Fatalf("a sparse upload of 12 KiB of data: %+v %v, want 12288 bytes", res, err)
			}
			if got := execOK(t, sb.ID, "stat", "-c", "%s", "/good"); got != "1073741824\n" {
				t.Fatalf("/good is %s bytes", got)
			}
			page, err := e.c.Events(ctxT(t), sb.Name, 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, ev := range page.Events {
				var d struct {
					Path  string `json:"path"`
					Bytes int64  `json:"bytes"`
				}
				json.Unmarshal(ev.Data, &d)
				if ev.Type == "sandbox.files_written" && d.Path == "/good" {
					found = true
					if d.Bytes != 3*4096 {
						t.Errorf("the ledger records %d bytes written, want 12288", d.Bytes)
					}
				}
			}
			if !found {
				t.Error("the ledger has no write of /good")
			}
		})
	}
}

// TestFilesPathNamesDir: a sandbox path that ends in / or /. names a
// directory: a file there is not_a_directory (as the kernel and docker cp
// say), never copied as the file; a directory so named still copies.
func TestFilesPathNamesDir(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "files-namesdir-" + prov})
			execOK(t, sb.ID, "sh", "-c", "mkdir -p /cp/dir && echo f > /cp/file && echo d > /cp/dir/in && ln -s file /cp/lnk")
			local := t.TempDir()
			for _, p := range []string{"/cp/file/", "/cp/file/.", "/cp/lnk/"} {
				if _, errOut, code := e.cli(t, "", "cp", sb.Name+":"+p, filepath.Join(local, "x")); code == 0 || !strings.Contains(errOut, "not a directory") {
					t.Errorf("cp %s: exit %d: %s", p, code, errOut)
				}
				_, err := e.c.StatFile(ctxT(t), sb.ID, p, false)
				wantCode(t, "stat "+p, err, 400, "not_a_directory", "not a directory")
				_, _, err = e.c.ReadFile(ctxT(t), sb.ID, p)
				wantCode(t, "read "+p, err, 400, "not_a_directory", "not a directory")
			}
			_, err := e.c.WriteFile(ctxT(t), sb.ID, "/cp/file/", strings.NewReader("new"), nil)
			wantCode(t, "write /cp/file/", err, 400, "not_a_directory", "not a directory")
			if _, err := os.Lstat(filepath.Join(local, "x")); err == nil {
				t.Fatal("a refused copy wrote x")
			}
			if got := execOK(t, sb.ID, "cat", "/cp/file"); got != "f\n" {
				t.Fatalf("/cp/file holds %q", got)
			}
			if _, errOut, code := e.cli(t, "", "cp", sb.Name+":/cp/dir/", filepath.Join(local, "d")); code != 0 {
				t.Fatalf("cp /cp/dir/: exit %d: %s", code, errOut)
			}
			wantTree(t, "dir/", filepath.Join(local, "d"), "in=d\n")
		})
	}
}

// helpersIn counts the files helpers running in sandbox sb.
func helpersIn(t *testing.T, sb string) int {
	t.Helper()
	n, _ := strconv.Atoi(strings.TrimSpace(execOK(t, sb, "sh", "-c", "ps -o args | grep -c '[f]iles-helper' || true")))
	return n
}

// TestFilesCopyOutCancelled: a copy out of a running gVisor sandbox of a
// file of 1 TiB of holes (which the Sentry shows as data: the helper reads
// it to find them, writing nothing for minutes) answers at once, and a
// client that gives up ends the helper in the sandbox within seconds.
// Before, its answer sat in its buffer until the scan ended, and it read on
// through the whole file after its client went (its SIGTERM reaches the
// host's runsc exec, not it). (runc's files say where their holes are:
// nothing is read there.)
func TestFilesCopyOutCancelled(t *testing.T) {
	e := need(t)
	t.Run("gvisor", func(t *testing.T) {
		sb := create(t, client.CreateRequest{Image: busybox, Provider: "gvisor", Name: "files-cancel-gvisor"})
		execOK(t, sb.ID, "sh", "-c", "truncate -s 1099511627776 /huge && echo data | dd of=/huge bs=4096 seek=1000 conv=notrunc 2>/dev/null")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		rc, info, err := e.c.ReadSparseArchive(ctx, sb.ID, "/huge", false)
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 15*time.Second || info.Size != 1<<40 {
			t.Fatalf("the answer came after %v (%+v)", took, info)
		}
		for deadline := time.Now().Add(10 * time.Second); helpersIn(t, sb.ID) == 0; time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no files helper runs in the sandbox during the copy")
			}
		}
		cancel()
		rc.Close()
		gone := time.Now()
		for helpersIn(t, sb.ID) > 0 {
			if time.Since(gone) > 10*time.Second {
				t.Fatal("the files helper still runs in the sandbox 10 s after its client went")
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Logf("the helper ended %v after its client went", time.Since(gone).Round(time.Millisecond))
	})
}

// TestFilesCopyTimes: a copy's modification time is never after its
// source's and within a second of it, both ways, a directory or a single
// file. A tar rounded them to the nearest second: a file of …20.7 arrived
// as …21.0, newer than its source.
func TestFilesCopyTimes(t *testing.T) {
	e := need(t)
	mtime := time.Unix(1_700_000_000, 700_000_000)
	notLater := func(t *testing.T, what string, got, src time.Time) {
		t.Helper()
		if got.After(src) || src.Sub(got) >= time.Second {
			t.Errorf("%s: mtime %s, its source's %s: want not later, within a second", what, got.Format(time.RFC3339Nano), src.Format(time.RFC3339Nano))
		}
	}
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Name: "files-times-" + prov})
			run := func(args ...string) {
				t.Helper()
				if _, errOut, code := e.cli(t, "", args...); code != 0 {
					t.Fatalf("shard %v: exit %d: %s", args, code, errOut)
				}
			}
			stat := func(p string) time.Time {
				t.Helper()
				fi, err := e.c.StatFile(ctxT(t), sb.ID, p, false)
				if err != nil {
					t.Fatal(err)
				}
				return fi.MTime
			}
			host := t.TempDir()
			src := filepath.Join(host, "d")
			os.Mkdir(src, 0o755)
			os.WriteFile(filepath.Join(src, "f"), []byte("f\n"), 0o644)
			for _, p := range []string{filepath.Join(src, "f"), src} {
				if err := os.Chtimes(p, mtime, mtime); err != nil {
					t.Fatal(err)
				}
			}
			// In.
			run("cp", src, sb.Name+":/in")
			run("cp", filepath.Join(src, "f"), sb.Name+":/single")
			for _, p := range []string{"/in", "/in/f", "/single"} {
				notLater(t, "in "+p, stat(p), mtime)
			}
			// Out: a file with a time of …20.7 in the sandbox (a single
			// file copied in keeps its nanoseconds), in a directory.
			execOK(t, sb.ID, "mkdir", "/out")
			run("cp", filepath.Join(src, "f"), sb.Name+":/out/f")
			if got := stat("/out/f"); !got.Equal(mtime) {
				t.Fatalf("/out/f: mtime %s, want %s", got.Format(time.RFC3339Nano), mtime.Format(time.RFC3339Nano))
			}
			dirTime := stat("/out")
			local := t.TempDir()
			run("cp", sb.Name+":/out", filepath.Join(local, "out"))
			run("cp", sb.Name+":/out/f", filepath.Join(local, "single"))
			for p, want := range map[string]time.Time{"out": dirTime, "out/f": mtime, "single": mtime} {
				fi, err := os.Stat(filepath.Join(local, p))
				if err != nil {
					t.Fatal(err)
				}
				notLater(t, "out "+p, fi.ModTime(), want)
			}
		})
	}
}
