package rootfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Receive writes the files saved under key (a checkpoint another node sent)
// from r: the data extents ext of a file of size bytes (what Extents
// found there), the rest holes, within the store's room.
func (s *Storage) Receive(key string, size int64, ext Extents, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(s.saved(key)), 0o700); err != nil {
		return err
	}
	return s.admitted(s.saved(key), ext.Bytes(), "a checkpoint's files sent by another node", func() error {
		f, err := os.OpenFile(s.saved(key), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		if err := WriteExtents(f, size, ext, r); err != nil {
			f.Close()
			os.Remove(s.saved(key))
			return err
		}
		return f.Close()
	})
}

// Extents are a sparse file's data regions, [offset, length] each, in order.
type Extents [][2]int64

// Bytes is the data the extents hold.
func (e Extents) Bytes() int64 {
	var n int64
	for _, x := range e {
		n += x[1]
	}
	return n
}

// String is the extents as "off:len,off:len" (for a tar record).
func (e Extents) String() string {
	parts := make([]string, len(e))
	for i, x := range e {
		parts[i] = strconv.FormatInt(x[0], 10) + ":" + strconv.FormatInt(x[1], 10)
	}
	return strings.Join(parts, ",")
}

// ParseExtents reads what String wrote, checking that the extents are in
// order, do not overlap and end within size.
func ParseExtents(s string, size int64) (Extents, error) {
	var out Extents
	end := int64(0)
	for _, p := range strings.Split(s, ",") {
		if p == "" {
			continue
		}
		a, b, ok := strings.Cut(p, ":")
		off, err1 := strconv.ParseInt(a, 10, 64)
		n, err2 := strconv.ParseInt(b, 10, 64)
		if !ok || err1 != nil || err2 != nil || off < end || n <= 0 || off+n > size || off+n < off {
			return nil, fmt.Errorf("bad extent %q", p)
		}
		out = append(out, [2]int64{off, n})
		end = off + n
	}
	return out, nil
}

// FileExtents finds f's data regions (SEEK_DATA/SEEK_HOLE): a checkpoint's
// memory file is mostly holes, and reading them would move zeros.
func FileExtents(f *os.File, size int64) (Extents, error) {
	var out Extents
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, syscall.ENXIO) {
			break
		}
		if err != nil {
			return nil, err
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		out = append(out, [2]int64{data, hole - data})
		off = hole
	}
	return out, nil
}

// WriteExtents writes the extents' data, read in order from r, into f and
// sets its size: what is not in an extent is a hole.
func WriteExtents(f *os.File, size int64, ext Extents, r io.Reader) error {
	for _, x := range ext {
		if _, err := io.CopyN(io.NewOffsetWriter(f, x[0]), r, x[1]); err != nil {
			return fmt.Errorf("extent at %d: %w", x[0], err)
		}
	}
	return f.Truncate(size)
}

// ReadExtents writes the extents' data of f to w, in order.
func ReadExtents(f *os.File, ext Extents, w io.Writer) error {
	for _, x := range ext {
		if _, err := io.Copy(w, io.NewSectionReader(f, x[0], x[1])); err != nil {
			return err
		}
	}
	return nil
}
