package network

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/errdefs"
)

// A create on a server whose run directory lost its netns directory is
// not an internal error: it says what broke and how to mend it.
func TestCreateNetnsDirGone(t *testing.T) {
	m := &Manager{cfg: Config{Bridge: "shnodir0", NetnsDir: filepath.Join(t.TempDir(), "gone", "netns"),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	_, err := m.Create(context.Background(), "sb1", netip.MustParseAddr("10.95.0.2"))
	if err == nil {
		t.Fatal("Create made a namespace in a directory that is not there")
	}
	if k := errdefs.KindOf(err); k != errdefs.KindUnavailable {
		t.Errorf("Create = %v (%s), want %s", err, k, errdefs.KindUnavailable)
	}
	if !strings.Contains(err.Error(), "run directory lost its netns directory") || strings.Contains(err.Error(), m.cfg.NetnsDir) {
		t.Errorf("Create = %q, want a message about the lost netns directory, without the host's path", err)
	}
}
