package rootfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/useshards/shard/internal/units"
	"golang.org/x/sys/unix"
)

// The store grows online, in three steps: the image file is allocated
// further on the host (never sparse: see makeImage), the loop device is told
// its file is bigger (LOOP_SET_CAPACITY), and XFS takes the new space
// (xfs_growfs). A crash between them leaves an image bigger than its
// filesystem, which the next growth (or the next Open) takes in. XFS does
// not shrink, so neither does the store: what it gave back to its files
// stays its own, free for the next sandboxes.

// errFixed says why a store cannot grow.
var errFixed = errors.New("the store is not an image this server made")

// growable reports whether the store may grow at all.
func (s *Storage) growable() bool { return s.image != "" && s.host != nil }

// grow makes the store at least short bytes bigger, by its own size (at
// most s.step) or more, within its ceiling; it returns the most it could have grown by when that
// is less than short (and then grows nothing). Caller holds admitMu.
func (s *Storage) grow(ctx context.Context, short int64) (room int64, err error) {
	if !s.growable() {
		return 0, errFixed
	}
	cur := fileSize(s.image)
	hs, err := s.host.State()
	if err != nil {
		return 0, err
	}
	room = hs.Spendable() &^ (1<<20 - 1)
	if s.max > 0 {
		room = min(room, max(0, s.max-cur))
	}
	if room < short {
		return room, nil
	}
	// A small store doubles, a big one grows by s.step: a server that
	// needs a little more than its first size does not take three times it.
	step := min(room, max(min(s.step, cur), (short+1<<20-1)&^(1<<20-1)))
	release, err := s.host.Take(step, "growing the sandbox store")
	if err != nil {
		return 0, err
	}
	defer release()
	f, err := os.OpenFile(s.image, os.O_RDWR, 0)
	if err != nil {
		return 0, fmt.Errorf("grow the sandbox store: %w", err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, cur, step)
	f.Close()
	if err != nil {
		// Give back what a partial allocation took: the file must end
		// where the filesystem does, or the next growth's count is off.
		os.Truncate(s.image, cur)
		return 0, fmt.Errorf("grow the sandbox store by %s: %w", units.FormatSize(step), err)
	}
	if err := s.takeIn(ctx); err != nil {
		return 0, err
	}
	s.log.Info("store: grew", "from", units.FormatSize(cur), "to", units.FormatSize(cur+step))
	return room, nil
}

// takeIn has the loop device and XFS take in all of the image file.
func (s *Storage) takeIn(ctx context.Context) error {
	dev, err := s.loopDevice()
	if err != nil {
		return fmt.Errorf("grow the sandbox store: %w", err)
	}
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("grow the sandbox store: %w", err)
	}
	err = unix.IoctlSetInt(fd, unix.LOOP_SET_CAPACITY, 0)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("grow the sandbox store: resize %s: %w", dev, err)
	}
	if out, err := exec.CommandContext(ctx, "xfs_growfs", "-d", s.dir).CombinedOutput(); err != nil {
		return fmt.Errorf("grow the sandbox store: xfs_growfs: %v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// loopDevice is the loop device the store is mounted from, checked to be
// backed by the store's image.
func (s *Storage) loopDevice() (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(s.dir, &st); err != nil {
		return "", err
	}
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	backing, err := os.ReadFile(filepath.Join(sys, "loop", "backing_file"))
	if err != nil {
		return "", fmt.Errorf("%s is not mounted from a loop device: %w", s.dir, err)
	}
	want, _ := filepath.Abs(s.image)
	if got := strings.TrimSpace(string(backing)); got != want {
		return "", fmt.Errorf("%s is mounted from %s, not the store's image %s", s.dir, got, want)
	}
	ue, err := os.ReadFile(filepath.Join(sys, "uevent"))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(ue), "\n") {
		if name, ok := strings.CutPrefix(l, "DEVNAME="); ok {
			return "/dev/" + name, nil
		}
	}
	return "", fmt.Errorf("no device name in %s/uevent", sys)
}

// catchUp takes in an image a crash left bigger than its filesystem.
func (s *Storage) catchUp(ctx context.Context) {
	var st unix.Statfs_t
	if s.image == "" || unix.Statfs(s.dir, &st) != nil {
		return
	}
	if fileSize(s.image)-int64(st.Blocks)*int64(st.Bsize) < 256<<20 {
		return
	}
	if err := s.takeIn(ctx); err != nil {
		s.log.Warn("store: could not take in the whole of its image", "err", err)
	}
}

// Size is the store image's size and the most it may grow to now (its
// ceiling, or what the host can give less the reserve); both 0 when the
// store is not an image this server made.
func (s *Storage) Size() (size, most int64) {
	if s.image == "" {
		return 0, 0
	}
	size = fileSize(s.image)
	most = size
	if s.host != nil {
		if hs, err := s.host.State(); err == nil {
			most += hs.Spendable() &^ (1<<20 - 1)
		}
		if s.max > 0 {
			most = min(most, max(size, s.max))
		}
	}
	return size, most
}
