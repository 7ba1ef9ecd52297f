package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServeRefusesLinkedDirs: shard serve refuses a --run-dir that leads
// into --data-dir through a symbolic link (it started, and every create
// then failed with a 500 about a missing netns file), whether the link
// leads somewhere when the flags are read or only once the server has made
// the data directory.
func TestServeRefusesLinkedDirs(t *testing.T) {
	e := need(t)
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "d5"), 0o700); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"plink": "d5", "dlink": "later"} {
		if err := os.Symlink(filepath.Join(dir, target), filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct{ name, data, run string }{
		{"a link to the data dir", "d5", "plink/run"},
		{"a link to a data dir the server makes", "later", "dlink/run"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			args := e.serveArgs(filepath.Join(dir, "sock"+tt.data), filepath.Join(dir, tt.data), filepath.Join(dir, tt.run),
				fmt.Sprintf("shlink%d", i), fmt.Sprintf("10.84.%d.0/24", i), "256MiB", "")
			cmd := exec.CommandContext(ctx, e.bin, args...)
			// A server that started anyway is stopped as an operator would,
			// so that it takes down what it set up.
			cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
			cmd.WaitDelay = 30 * time.Second
			out, err := cmd.CombinedOutput()
			if err == nil || ctx.Err() != nil {
				t.Fatalf("shard serve --data-dir %s --run-dir %s: %v, want it refused at once:\n%s", tt.data, tt.run, err, out)
			}
			if !strings.Contains(string(out), "is inside --data-dir "+filepath.Join(dir, tt.data)) {
				t.Errorf("shard serve --data-dir %s --run-dir %s said:\n%s\nwant the run dir inside the data dir", tt.data, tt.run, out)
			}
		})
	}
}
