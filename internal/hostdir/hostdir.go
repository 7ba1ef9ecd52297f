// Package hostdir makes the host directories that hold what sandboxes and
// images control. Such trees hold files a sandbox or an image chose (a
// setuid-root binary, a device node, a 200 MiB file): no host user but root
// may reach them, so every one sits under a directory only root can enter.
package hostdir

import (
	"fmt"
	"os"
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
