// Package hostdir makes the host directories that hold what sandboxes and
// images control. Such trees hold files a sandbox or an image chose (a
// setuid-root binary, a device node, a 200 MiB file): no host user but root
// may reach them, so every one sits under a directory only root can enter.
package hostdir

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Private makes dir (and its parents) and leaves it mode 0700, also when it
// existed with a looser mode (a data directory made by an older server).
func Private(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if st.Mode().Perm() != 0o700 {
		return os.Chmod(dir, 0o700)
	}
	return nil
}

// Blocks is the space the files under dir take (their allocated blocks,
// not their sizes: sparse files and tmpfs count what they hold). Like du -x
// it stays on dir's own filesystem: a sandbox's root mounted below dir is
// that sandbox's, and counting it here counted it twice.
func Blocks(dir string) int64 {
	var root syscall.Stat_t
	if err := syscall.Lstat(dir, &root); err != nil {
		return 0
	}
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if st.Dev != root.Dev {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		n += st.Blocks * 512
		return nil
	})
	return n
}
