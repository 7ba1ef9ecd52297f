package rootfs

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestExtentsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	src, err := os.Create(filepath.Join(dir, "src"))
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	data := bytes.Repeat([]byte("x"), 8192)
	for _, off := range []int64{0, 1 << 20, 40 << 20} {
		if _, err := src.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	src.Truncate(size)
	ext, err := FileExtents(src, size)
	if err != nil {
		t.Fatal(err)
	}
	if ext.Bytes() >= 1<<20 || len(ext) == 0 {
		t.Fatalf("extents of a sparse file: %v (%d bytes)", ext, ext.Bytes())
	}
	back, err := ParseExtents(ext.String(), size)
	if err != nil || back.String() != ext.String() {
		t.Fatalf("parse %q: %v %v", ext.String(), back, err)
	}
	var buf bytes.Buffer
	if err := ReadExtents(src, ext, &buf); err != nil {
		t.Fatal(err)
	}
	dst, err := os.Create(filepath.Join(dir, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteExtents(dst, size, ext, &buf); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src.Name())
	b, _ := os.ReadFile(dst.Name())
	if !bytes.Equal(a, b) {
		t.Fatal("the copy differs")
	}
	for _, bad := range []string{"0:10,5:10", "-1:4", "0:0", "10:5000000000", "x"} {
		if _, err := ParseExtents(bad, size); err == nil {
			t.Errorf("ParseExtents(%q) accepted", bad)
		}
	}
}
