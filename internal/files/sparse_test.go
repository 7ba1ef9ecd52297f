package files

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/useshards/shard/internal/sparse"
	"golang.org/x/sys/unix"
)

// holey makes a file of size bytes at p with data at each of offs (64 KiB
// of random bytes each), the rest holes.
func holey(t *testing.T, p string, size int64, offs ...int64) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := make([]byte, 64<<10)
	for _, off := range offs {
		rand.Read(data)
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
}

// allocated is what p takes on its disk.
func allocated(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Blocks * 512
}

func sameFile(t *testing.T, a, b string) {
	t.Helper()
	x, err1 := os.ReadFile(a)
	y, err2 := os.ReadFile(b)
	if err1 != nil || err2 != nil || !bytes.Equal(x, y) {
		t.Fatalf("%s and %s differ (%v %v)", a, b, err1, err2)
	}
}

// TestSparseTarRoundTrip: a file that has holes is archived as its data
// and unpacked with the same holes; a file without holes is archived as
// it always was (no sparse records, which other tar tools do not know).
func TestSparseTarRoundTrip(t *testing.T) {
	src := filepath.Join(t.TempDir(), "top")
	os.Mkdir(src, 0o755)
	const size = 256 << 20
	holey(t, filepath.Join(src, "holes"), size, 0, 100<<20, size-(64<<10))
	holey(t, filepath.Join(src, "empty"), size)
	os.WriteFile(filepath.Join(src, "dense"), bytes.Repeat([]byte("d"), 100<<10), 0o644)
	var b bytes.Buffer
	if err := WriteTar(context.Background(), &b, src, "top", TarOptions{Sparse: true}); err != nil {
		t.Fatal(err)
	}
	if b.Len() > 1<<20 {
		t.Fatalf("the archive is %d bytes: holes were sent", b.Len())
	}
	tr := tar.NewReader(bytes.NewReader(b.Bytes()))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		_, _, isSparse, err := sparse.FromHeader(hdr)
		if err != nil || isSparse != (hdr.Name == "top/holes" || hdr.Name == "top/empty") {
			t.Errorf("%s: sparse %v (%v)", hdr.Name, isSparse, err)
		}
	}
	dst := t.TempDir()
	if res := Unpack(&b, dst, UnpackOptions{}); !res.OK {
		t.Fatalf("unpack: %+v", res)
	}
	for _, name := range []string{"holes", "empty", "dense"} {
		sameFile(t, filepath.Join(src, name), filepath.Join(dst, "top", name))
	}
	if a := allocated(t, filepath.Join(dst, "top", "holes")); a > 1<<20 {
		t.Errorf("the copy of a file of 192 KiB of data takes %d bytes", a)
	}
	if a := allocated(t, filepath.Join(dst, "top", "empty")); a != 0 {
		t.Errorf("the copy of a file of holes takes %d bytes", a)
	}
}

// sparseEntry is an archive of one sparse entry with the records given,
// holding data.
func sparseEntry(t *testing.T, name string, records map[string]string, data []byte) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	hdr := &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data)), Format: tar.FormatPAX, PAXRecords: records}
	if err := tw.WriteHeader(hdr); err != nil {
		t.Fatal(err)
	}
	tw.Write(data)
	tw.Close()
	return &b
}

// TestSparseEntriesAreHostile: a sender (a sandbox) says what it likes in
// the records. What is written is only the data the archive carries,
// however large the size it claims; records that do not match the data
// are refused.
func TestSparseEntriesAreHostile(t *testing.T) {
	dst := t.TempDir()
	huge := strings.Repeat("x", 4096)
	b := sparseEntry(t, "huge", map[string]string{sparse.RecordSize: "1099511627776", sparse.RecordExtents: "1099511623680:4096"}, []byte(huge))
	if res := Unpack(b, dst, UnpackOptions{}); !res.OK {
		t.Fatalf("a large sparse file: %+v", res)
	}
	p := filepath.Join(dst, "huge")
	if fi, _ := os.Stat(p); fi.Size() != 1<<40 || allocated(t, p) > 64<<10 {
		t.Fatalf("a file of 4 KiB of data and 1 TiB of holes: size %d, takes %d bytes", fi.Size(), allocated(t, p))
	}
	for name, rec := range map[string]map[string]string{
		"more data than the extents": {sparse.RecordSize: "100", sparse.RecordExtents: "0:10"},
		"extents past the size":      {sparse.RecordSize: "10", sparse.RecordExtents: "0:10,20:40"},
		"no size":                    {sparse.RecordExtents: "0:50"},
	} {
		res := Unpack(sparseEntry(t, "bad", rec, make([]byte, 50)), dst, UnpackOptions{})
		if res.OK || res.Code != CodeBadArchive {
			t.Errorf("%s: %+v, want %s", name, res, CodeBadArchive)
		}
		if _, err := os.Lstat(filepath.Join(dst, "bad")); err == nil {
			t.Errorf("%s: the entry was made", name)
		}
	}
}

// TestPutSparseFile: a file sent as a tar of it (one entry, sparse) is
// written with its holes, replacing the old one whole and taking the
// mode the upload gives; a tar of anything but one regular file is
// refused and leaves the old file.
func TestPutSparseFile(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	holey(t, src, 64<<20, 1<<20, 50<<20)
	var b bytes.Buffer
	if err := WriteTar(context.Background(), &b, src, "whatever", TarOptions{Sparse: true}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "dst")
	os.WriteFile(p, []byte("old"), 0o600)
	put := func(r io.Reader) Result {
		var framed bytes.Buffer
		w := NewChunkWriter(&framed)
		io.Copy(w, r)
		w.Close()
		return Put(context.Background(), NewChunkReader(&framed), p, PutOptions{Mode: 0o640, UID: -1, GID: -1, Size: -1, Sparse: true})
	}
	// Bytes is the data written (2 x 64 KiB), not the file's size.
	if res := put(bytes.NewReader(b.Bytes())); !res.OK || res.Bytes != 128<<10 {
		t.Fatalf("put: %+v", res)
	}
	sameFile(t, src, p)
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o640 || allocated(t, p) > 1<<20 {
		t.Fatalf("mode %v, takes %d bytes", fi.Mode(), allocated(t, p))
	}
	os.WriteFile(p, []byte("old"), 0o600)
	var two bytes.Buffer
	tw := tar.NewWriter(&two)
	for _, name := range []string{"a", "b"} {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
		tw.Write([]byte("x"))
	}
	tw.Close()
	link := archive(t, &tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"})
	for name, body := range map[string][]byte{
		"two files":    two.Bytes(),
		"a symlink":    link,
		"not a tar":    []byte(strings.Repeat("junk", 200)),
		"an empty tar": archive(t),
	} {
		if res := put(bytes.NewReader(body)); res.OK || res.Code != CodeBadArchive {
			t.Errorf("%s: %+v, want %s", name, res, CodeBadArchive)
		}
		if got, _ := os.ReadFile(p); string(got) != "old" {
			t.Errorf("%s: the file holds %q", name, got)
		}
	}
}

// TestUnpackHoles: with Holes, the blocks of zeros of a file sent whole
// (by a sender that did not find its holes, or would not) are not
// written; without, the file is written as it comes.
func TestUnpackHoles(t *testing.T) {
	body := make([]byte, 32<<20)
	copy(body[10<<20:], "data")
	tarOf := func() io.Reader {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		tw.WriteHeader(&tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
		tw.Write(body)
		tw.Close()
		return &b
	}
	for _, holes := range []bool{true, false} {
		dst := t.TempDir()
		if res := Unpack(tarOf(), dst, UnpackOptions{Holes: holes}); !res.OK || res.Bytes != int64(len(body)) {
			t.Fatalf("holes %v: %+v", holes, res)
		}
		p := filepath.Join(dst, "zeros")
		if got, _ := os.ReadFile(p); !bytes.Equal(got, body) {
			t.Fatalf("holes %v: the file differs", holes)
		}
		if room := allocated(t, p); (room > 1<<20) == holes {
			t.Errorf("holes %v: 32 MiB of which 4 bytes of data take %d bytes", holes, room)
		}
	}
}

// TestReadHoles: where the file system does not say where a file's holes
// are (inside gVisor a file is all data and st_blocks its size), ReadHoles
// finds them by reading: a file of blocks of zeros written out in full is
// sent as its data then, and whole without.
func TestReadHoles(t *testing.T) {
	src := filepath.Join(t.TempDir(), "top")
	os.Mkdir(src, 0o755)
	body := make([]byte, 4<<20)
	copy(body[1<<20:], "data")
	os.WriteFile(filepath.Join(src, "zeros"), body, 0o644)
	os.WriteFile(filepath.Join(src, "small"), make([]byte, 64<<10), 0o644) // sent whole: under minReadHoles
	for _, readHoles := range []bool{true, false} {
		var b bytes.Buffer
		if err := WriteTar(context.Background(), &b, src, "top", TarOptions{Sparse: true, ReadHoles: readHoles}); err != nil {
			t.Fatal(err)
		}
		if (b.Len() < 128<<10) != readHoles {
			t.Errorf("read holes %v: an archive of %d bytes", readHoles, b.Len())
		}
		dst := t.TempDir()
		if res := Unpack(&b, dst, UnpackOptions{}); !res.OK {
			t.Fatalf("unpack: %+v", res)
		}
		sameFile(t, filepath.Join(src, "zeros"), filepath.Join(dst, "top", "zeros"))
	}
}

// TestReadHolesDense: a file without blocks of zeros is sent whole, read
// once (its probes find no zeros).
func TestReadHolesDense(t *testing.T) {
	src := filepath.Join(t.TempDir(), "dense")
	body := make([]byte, 4<<20)
	rand.Read(body)
	os.WriteFile(src, body, 0o644)
	var b bytes.Buffer
	if err := WriteTar(context.Background(), &b, src, "dense", TarOptions{Sparse: true, ReadHoles: true}); err != nil {
		t.Fatal(err)
	}
	hdr, err := tar.NewReader(&b).Next()
	if _, _, isSparse, _ := sparse.FromHeader(hdr); err != nil || isSparse || hdr.Size != int64(len(body)) {
		t.Fatalf("a dense file: %+v %v", hdr, err)
	}
}

// putSparse puts body (a tar of one file) at p as a sparse upload.
func putSparse(p string, body []byte) Result {
	var framed bytes.Buffer
	w := NewChunkWriter(&framed)
	w.Write(body)
	w.Close()
	return Put(context.Background(), NewChunkReader(&framed), p, PutOptions{Mode: -1, UID: -1, GID: -1, Size: -1, Sparse: true})
}

// TestSparseExtentsAreWholeBlocks: a sender's extents are whole blocks
// (but the last, to the file's end). Extents of one byte each, a block
// apart, took a block of the receiver's disk for each byte sent (1.5 MB
// sent wrote 469 MB): such an entry is refused as a bad archive, by the
// CLI's unpack and by a sparse upload, and nothing of it is kept.
func TestSparseExtentsAreWholeBlocks(t *testing.T) {
	const n = 2000
	var ext sparse.Extents // a byte a block apart
	for i := range int64(n) {
		ext = append(ext, [2]int64{i * sparse.Block, 1})
	}
	size := int64(n * sparse.Block)
	bomb := sparseEntry(t, "bomb", map[string]string{sparse.RecordSize: fmt.Sprint(size), sparse.RecordExtents: ext.String()}, bytes.Repeat([]byte("b"), n)).Bytes()
	dst := t.TempDir()
	if res := Unpack(bytes.NewReader(bomb), dst, UnpackOptions{Holes: true}); res.OK || res.Code != CodeBadArchive {
		t.Errorf("the CLI's unpack: %+v, want %s", res, CodeBadArchive)
	}
	if _, err := os.Lstat(filepath.Join(dst, "bomb")); err == nil {
		t.Error("the CLI's unpack made the entry")
	}
	p := filepath.Join(dst, "put")
	if res := putSparse(p, bomb); res.OK || res.Code != CodeBadArchive {
		t.Errorf("a sparse upload: %+v, want %s", res, CodeBadArchive)
	}
	if _, err := os.Lstat(p); err == nil {
		t.Error("the sparse upload wrote the file")
	}
	// Whole blocks, and a last extent to an end off a block, are taken.
	data := bytes.Repeat([]byte("d"), 2*sparse.Block+10)
	ok := sparseEntry(t, "ok", map[string]string{sparse.RecordSize: fmt.Sprint(10*sparse.Block + 10), sparse.RecordExtents: fmt.Sprintf("%d:%d,%d:%d", 0, 2*sparse.Block, 10*sparse.Block, 10)}, data).Bytes()
	if res := Unpack(bytes.NewReader(ok), dst, UnpackOptions{Holes: true}); !res.OK || res.Bytes != int64(len(data)) {
		t.Fatalf("whole blocks: %+v", res)
	}
	if fi, err := os.Stat(filepath.Join(dst, "ok")); err != nil || fi.Size() != 10*sparse.Block+10 {
		t.Fatalf("whole blocks: %v %v", fi, err)
	}
}

// TestReadStopsWithoutReader: a read that finds holes stops once its
// output has no reader (WatchOutput), and a tar of a file whose holes are
// read stops with its context: it writes nothing for minutes, so a write's
// EPIPE would not tell it.
func TestReadStopsWithoutReader(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, stop := WatchOutput(context.Background(), int(w.Fd()), 50*time.Millisecond)
	defer stop()
	time.Sleep(100 * time.Millisecond)
	if ctx.Err() != nil {
		t.Fatal("cancelled while its reader is there")
	}
	r.Close()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not cancelled 5 s after its reader went")
	}
	src := filepath.Join(t.TempDir(), "zeros")
	os.WriteFile(src, make([]byte, 4<<20), 0o644)
	if err := WriteTar(ctx, io.Discard, src, "zeros", TarOptions{Sparse: true, ReadHoles: true}); err != context.Canceled {
		t.Fatalf("a tar with its context done: %v", err)
	}
}

// TestResultFlushed: the answer line goes out at once, before what
// follows it (which a scan of holes may keep waiting): a buffered writer
// is flushed.
func TestResultFlushed(t *testing.T) {
	var b bytes.Buffer
	out := bufio.NewWriterSize(&b, 64<<10)
	if err := WriteResult(out, Result{OK: true}); err != nil {
		t.Fatal(err)
	}
	if b.String() != "{\"ok\":true}\n" {
		t.Fatalf("after the answer, %q went out", b.String())
	}
}

// TestSparseTooLarge: a file past the largest the filesystem holds (EFBIG;
// here a file size limit, RLIMIT_FSIZE, stands for the filesystem's) is
// too_large, saying so, not an I/O error: a sparse entry's size in the
// CLI's unpack and in a sparse upload, and a plain upload's bytes. Nothing
// of it is kept. The limit is the process's, so a child runs it.
func TestSparseTooLarge(t *testing.T) {
	const limit = 1 << 20
	if os.Getenv("SHARD_TEST_FSIZE") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSparseTooLarge$", "-test.v")
		cmd.Env = append(os.Environ(), "SHARD_TEST_FSIZE=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("checked under the limit")) {
			t.Fatalf("the child under a file size limit: %v\n%s", err, out)
		}
		return
	}
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: limit, Max: limit}); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	huge := sparseEntry(t, "huge", map[string]string{sparse.RecordSize: fmt.Sprint(1 << 30), sparse.RecordExtents: "0:4096"}, bytes.Repeat([]byte("h"), 4096)).Bytes()
	p := filepath.Join(dst, "put")
	for name, res := range map[string]Result{
		"the CLI's unpack": Unpack(bytes.NewReader(huge), dst, UnpackOptions{Holes: true}),
		"a sparse upload":  putSparse(p, huge),
		"a plain upload":   Put(context.Background(), bytes.NewReader(make([]byte, 2*limit)), p, PutOptions{Mode: -1, UID: -1, GID: -1, Size: -1}),
	} {
		if res.OK || res.Code != CodeTooLarge || !strings.Contains(res.Message, "past the largest file the filesystem holds") {
			t.Errorf("%s: %+v, want %s", name, res, CodeTooLarge)
		}
	}
	if left, _ := os.ReadDir(dst); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
	t.Log("checked under the limit")
}
