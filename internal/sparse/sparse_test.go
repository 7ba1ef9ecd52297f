package sparse

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"math"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// sparseFile makes a file of size bytes holding data at each of offs, the
// rest holes.
func sparseFile(t *testing.T, size int64, data []byte, offs ...int64) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "src"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	for _, off := range offs {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestExtentsRoundTrip(t *testing.T) {
	const size = 64 << 20
	src := sparseFile(t, size, bytes.Repeat([]byte("x"), 8192), 0, 1<<20, 40<<20)
	ext, err := Find(src, size)
	if err != nil {
		t.Fatal(err)
	}
	if ext.Bytes() >= 1<<20 || len(ext) == 0 {
		t.Fatalf("extents of a sparse file: %v (%d bytes)", ext, ext.Bytes())
	}
	back, err := Parse(ext.String(), size)
	if err != nil || back.String() != ext.String() {
		t.Fatalf("parse %q: %v %v", ext.String(), back, err)
	}
	var buf bytes.Buffer
	if err := ReadExtents(src, ext, &buf); err != nil {
		t.Fatal(err)
	}
	dst, err := os.Create(filepath.Join(t.TempDir(), "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if err := WriteExtents(dst, size, ext, &buf); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src.Name())
	b, _ := os.ReadFile(dst.Name())
	if !bytes.Equal(a, b) {
		t.Fatal("the copy differs")
	}
	for _, bad := range []string{"0:4096,2048:4096", "-4096:4096", "0:0", "4096:5000000000", "x"} {
		if _, err := Parse(bad, size); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

// TestScan: the blocks that hold a byte other than zero are the data,
// however the reads fall on them; a file that ends inside an extent ends
// the scan there.
func TestScan(t *testing.T) {
	const size = 10 << 20
	f := sparseFile(t, size, []byte("y"), 5000, 3<<20, 3<<20+4096, size-1)
	// Zeros written are data to SEEK_DATA, holes to Scan.
	if _, err := f.WriteAt(make([]byte, 1<<20), 6<<20); err != nil {
		t.Fatal(err)
	}
	for _, bufSize := range []int{Block, 3 * Block, 1 << 20} {
		got, err := Scan(context.Background(), f, Extents{{0, size}}, make([]byte, bufSize))
		if err != nil {
			t.Fatal(err)
		}
		want := Extents{{4096, 4096}, {3 << 20, 8192}, {size - 4096, 4096}}
		if got.String() != want.String() {
			t.Errorf("buffer %d: Scan = %v, want %v", bufSize, got, want)
		}
	}
	got, err := Scan(context.Background(), f, Extents{{3 << 20, 20 << 20}}, make([]byte, 1<<20))
	if err != nil || got.String() != (Extents{{3 << 20, 8192}, {size - 4096, 4096}}).String() {
		t.Errorf("Scan past the end: %v %v", got, err)
	}
}

// TestMaxExtents: a file cut into more regions than MaxExtents is given in
// at most MaxExtents, its smallest holes taken as data, still covering
// every byte of data.
func TestMaxExtents(t *testing.T) {
	b := builder{size: math.MaxInt64}
	const n = 3 * MaxExtents
	for i := range int64(n) {
		gap := int64(4096)
		if i%1000 == 0 {
			gap = 1 << 30 // a few big holes, which stay
		}
		b.add(i*(1<<31)+gap, 4096)
	}
	if len(b.ext) > MaxExtents || len(b.ext) < 2 {
		t.Fatalf("%d extents", len(b.ext))
	}
	for i := range int64(n) {
		off := i*(1<<31) + 4096
		if i%1000 == 0 {
			off = i*(1<<31) + 1<<30
		}
		covered := false
		for _, x := range b.ext {
			covered = covered || (x[0] <= off && off+4096 <= x[0]+x[1])
		}
		if !covered {
			t.Fatalf("data at %d is in no extent", off)
		}
	}
	if s := b.ext.String(); len(s) > 1<<20 {
		t.Fatalf("the extents record is %d bytes", len(s))
	}
}

// TestParseWholeBlocks: extents are whole blocks, but the one that ends
// at the file's end: extents of a byte each, a block apart, would each
// take a block of the receiver's disk (4096 times the data sent).
func TestParseWholeBlocks(t *testing.T) {
	const size = 10*Block + 100
	for s, ok := range map[string]bool{
		"0:4096,8192:8192":    true,
		"0:40960":             true,
		"0:41060":             true, // to the end, which is not on a block
		"40960:100":           true,
		"4096:4096,40960:100": true,
		"0:1":                 false,
		"1:4095":              false,
		"0:4096,8192:1":       false,
		"0:4097":              false,
		"40960:99":            false, // short of the end
		"2048:4096":           false,
	} {
		if _, err := Parse(s, size); (err == nil) != ok {
			t.Errorf("Parse(%q, %d): %v, want ok %v", s, int64(size), err, ok)
		}
	}
}

// TestBuilderWholeBlocks: what Find and Scan give is whole blocks (what
// Parse takes), however small the regions found (a file system of 1 KiB
// blocks): each is widened to the blocks it touches, within the size.
func TestBuilderWholeBlocks(t *testing.T) {
	b := builder{size: 5*Block + 10}
	for _, x := range [][2]int64{{1024, 1024}, {3072, 512}, {2*Block + 100, 10}, {5 * Block, 10}} {
		b.add(x[0], x[1])
	}
	want := Extents{{0, Block}, {2 * Block, Block}, {5 * Block, 10}}
	if b.ext.String() != want.String() {
		t.Fatalf("extents %v, want %v", b.ext, want)
	}
	if _, err := Parse(b.ext.String(), b.size); err != nil {
		t.Fatal(err)
	}
	near := builder{size: math.MaxInt64}
	near.add(math.MaxInt64-10, 5)
	if want := (Extents{{math.MaxInt64 / Block * Block, math.MaxInt64 % Block}}); near.ext.String() != want.String() {
		t.Fatalf("an extent near the largest size: %v, want %v", near.ext, want)
	}
}

// TestScanStops: a scan whose context is done stops, reading no more.
func TestScanStops(t *testing.T) {
	f := sparseFile(t, 64<<20, []byte("z"), 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Scan(ctx, f, Extents{{0, 64 << 20}}, make([]byte, 1<<20)); err != context.Canceled {
		t.Fatalf("Scan with its context done: %v", err)
	}
}

// TestFromHeader: the records are checked as a hostile sender's; an entry
// without them is not sparse.
func TestFromHeader(t *testing.T) {
	hdr := &tar.Header{Name: "f"}
	Header(hdr, 1<<40+5, Extents{{0, 4096}, {1 << 40, 5}})
	size, ext, ok, err := FromHeader(hdr)
	if err != nil || !ok || size != 1<<40+5 || hdr.Size != 4101 || len(ext) != 2 {
		t.Fatalf("FromHeader = %d %v %v %v (size %d)", size, ext, ok, err, hdr.Size)
	}
	if _, _, ok, err := FromHeader(&tar.Header{Name: "plain", Size: 3}); ok || err != nil {
		t.Fatalf("a plain entry: %v %v", ok, err)
	}
	for name, rec := range map[string]map[string]string{
		"no size":         {RecordExtents: "0:3"},
		"negative size":   {RecordSize: "-1", RecordExtents: ""},
		"past the size":   {RecordSize: "2", RecordExtents: "0:3"},
		"overlapping":     {RecordSize: "100", RecordExtents: "0:2,1:1"},
		"not the data":    {RecordSize: "100", RecordExtents: "0:2"},
		"overflowing end": {RecordSize: "100", RecordExtents: "9223372036854775807:3"},
	} {
		if _, _, _, err := FromHeader(&tar.Header{Name: name, Size: 3, PAXRecords: rec}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestHoleWriter: what is written reads back the same, however the writes
// fall; its blocks of zeros take no room.
func TestHoleWriter(t *testing.T) {
	const size = 8<<20 + 100 // ends inside a block of zeros
	want := make([]byte, size)
	copy(want[5000:], "data at 5000")
	copy(want[3<<20:], bytes.Repeat([]byte("y"), 10000))
	for _, chunk := range []int{1000, 4096, 1 << 20} {
		f, err := os.Create(filepath.Join(t.TempDir(), "f"))
		if err != nil {
			t.Fatal(err)
		}
		w := NewHoleWriter(f)
		for p := want; len(p) > 0; p = p[min(chunk, len(p)):] {
			if n, err := w.Write(p[:min(chunk, len(p))]); err != nil || n != min(chunk, len(p)) {
				t.Fatalf("write: %d %v", n, err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(f.Name())
		fi, _ := f.Stat()
		f.Close()
		if !bytes.Equal(got, want) {
			t.Fatalf("chunks of %d: the file differs", chunk)
		}
		if room := fi.Sys().(*syscall.Stat_t).Blocks * 512; room > 64<<10 {
			t.Errorf("chunks of %d: 16 KiB of data take %d bytes", chunk, room)
		}
	}
}

// TestProbe: a file without blocks of zeros passes every probe; one of
// which they are half (or all, or a hole) does not.
func TestProbe(t *testing.T) {
	dense := make([]byte, 4<<20)
	rand.Read(dense)
	half := bytes.Clone(dense)
	for i := 0; i < len(half); i += 2 * Block {
		clear(half[i : i+Block])
	}
	for name, tc := range map[string]struct {
		data []byte
		want bool
	}{
		"dense": {dense, false}, "half zeros": {half, true}, "all zeros": {make([]byte, 4<<20), true},
	} {
		p := filepath.Join(t.TempDir(), "f")
		os.WriteFile(p, tc.data, 0o644)
		f, _ := os.Open(p)
		got, err := Probe(f, int64(len(tc.data)), 64)
		f.Close()
		if err != nil || got != tc.want {
			t.Errorf("%s: Probe = %v %v, want %v", name, got, err, tc.want)
		}
	}
}
