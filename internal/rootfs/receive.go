package rootfs

import (
	"io"
	"os"
	"path/filepath"

	"github.com/useshards/shard/internal/sparse"
)

// Receive writes the files saved under key (a checkpoint another node sent)
// from r: the data extents ext of a file of size bytes (what sparse.Find
// found there), the rest holes, within the store's room.
func (s *Storage) Receive(key string, size int64, ext sparse.Extents, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(s.saved(key)), 0o700); err != nil {
		return err
	}
	return s.admitted(s.saved(key), ext.Bytes(), "a checkpoint's files sent by another node", func() error {
		f, err := os.OpenFile(s.saved(key), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		if err := sparse.WriteExtents(f, size, ext, r); err != nil {
			f.Close()
			os.Remove(s.saved(key))
			return err
		}
		return f.Close()
	})
}
