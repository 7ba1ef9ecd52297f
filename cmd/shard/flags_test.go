package main

import (
	"context"
	"github.com/useshards/shard/internal/network"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/internal/testenv"
)

// A bad flag is refused before anything is sent (the socket here does not
// exist: a command that got past its checks fails with "cannot reach"
// instead), saying the flag and what it takes. The old CLI sent all of
// these: --pids 9223372036854775807, --cpu 0.0001 (then a whole cpu),
// --count 0 (then one fork), --tag a/b, --name ../x for an import,
// --timeout 500µs (then no timeout).
func TestFlagsRefused(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	tests := []struct {
		args []string
		want string // part of the error; "cannot reach" when the flags pass
	}{
		{[]string{"create", "--pids", "9223372036854775807", "busybox"}, "--pids 9223372036854775807 is out of range: from 8 to 4194304"},
		{[]string{"create", "--pids", "2147483648", "busybox"}, "--pids"},
		{[]string{"create", "--pids", "0", "busybox"}, "--pids 0 is out of range"},
		{[]string{"create", "--pids", "4194304", "busybox"}, "cannot reach"},
		{[]string{"create", "--cpu", "0.0001", "busybox"}, "--cpu: \"0.0001\" is finer than"},
		{[]string{"create", "--memory", "17592186044928MiB", "busybox"}, "--memory: \"17592186044928MiB\" is too large"},
		{[]string{"create", "--memory", "0", "busybox"}, "--memory must be above zero"},
		{[]string{"create", "--disk", "0.3KiB", "busybox"}, "--disk: \"0.3KiB\" is not a whole number of bytes"},
		{[]string{"create", "--name", "../x", "busybox"}, "--name: sandbox name"},
		{[]string{"create", "--memory", "1GiB", "--cpu", "0.5", "busybox"}, "cannot reach"},
		{[]string{"env", "create", "e", "--cpu", "0.0001", "busybox"}, "--cpu: "},
		{[]string{"fork", "--count", "0", "base"}, "--count 0 is out of range: from 1 to 64"},
		{[]string{"fork", "--count", "65", "base"}, "--count 65"},
		{[]string{"fork", "--count", "-1", "base"}, "--count -1"},
		{[]string{"fork", "--tag", "a/b", "base"}, "--tag: tag"},
		{[]string{"fork", "--name", strings.Repeat("a", 62), "--count", "10", "base"}, "--name: fork name"},
		{[]string{"fork", "--count", "3", "--name", "try", "base"}, "cannot reach"},
		{[]string{"checkpoint", "--tag", strings.Repeat("t", 300), "base"}, "at most 128"},
		{[]string{"checkpoint", "--tag", "a\x00b", "base"}, "--tag: tag"},
		{[]string{"checkpoint", "--tag", "deps-1.2", "base"}, "cannot reach"},
		{[]string{"image", "import", "--name", "../x", "f.tar"}, "--name: image reference"},
		{[]string{"image", "import", "--name", "..:5000/x", "f.tar"}, "--name: image reference"},
		{[]string{"exec", "--timeout", "500us", "base", "true"}, "--timeout 500µs is finer than a millisecond"},
		{[]string{"exec", "--timeout", "-1s", "base", "true"}, "must be positive"},
		{[]string{"exec", "--timeout", "100000h", "base", "true"}, "too long"},
		{[]string{"grant", "--env", "A=B", "base", "s"}, "--env: "},
		{[]string{"grant", "--file", "/etc/../x", "base", "s"}, "--file "},
		{[]string{"port", "--print-url", "base", "+80"}, "from 1 to 65535"},
	}
	for _, tt := range tests {
		root := newRoot()
		root.SetArgs(append(tt.args, "--socket", sock))
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("shard %s = %v; want an error saying %q", strings.Join(tt.args, " "), err, tt.want)
		}
	}
}

// serve refuses numbers it would have read as something else: a storage
// size of 0 was "auto", a negative --max-sandboxes no limit, before it
// makes any directory.
func TestServeFlagsRefused(t *testing.T) {
	testenv.RequireRoot(t, "serve checks for root first")
	// The directories are under a file: were a flag let through, serve
	// would fail there, before it made a network or a mount.
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	base := serveOptions{logLevel: "info", subnet: "10.88.0.0/16", storageSize: "4GiB", storageMax: "auto", reserve: "2GiB", defaultDisk: "2GiB", maxImageSize: "16GiB", freezeTimeout: time.Minute,
		pullTimeout: time.Hour, idleTimeout: time.Minute, bodyTimeout: time.Minute, maxMemory: "host", maxCPU: "host", maxPids: 4096, ledgerMinFree: "auto", mtu: network.DefaultMTU, forkMemory: "handoff", maxConnections: network.DefaultMaxConnections,
		dataDir: filepath.Join(blocker, "data"), runDir: filepath.Join(blocker, "run"), socket: filepath.Join(blocker, "sock")}
	for _, tt := range []struct {
		set  func(*serveOptions)
		want string
	}{
		{func(o *serveOptions) { o.storageSize = "0" }, `--storage-size "0": give a size of at least 256MiB`},
		{func(o *serveOptions) { o.storageMax = "1GiB" }, `--storage-max "1GiB": give auto, or a size of at least --storage-size (4GiB)`},
		{func(o *serveOptions) { o.reserve = "lots" }, "--reserve"},
		{func(o *serveOptions) { o.memoryOvercommit = -1 }, "--memory-overcommit -1"},
		{func(o *serveOptions) { o.memoryOvercommit = 1e-7 }, "give a ratio from 0.1 to 100"},
		{func(o *serveOptions) { o.storageSize = "9EiB" }, "--storage-size"},
		{func(o *serveOptions) { o.maxSandboxes = -1 }, "--max-sandboxes -1"},
		{func(o *serveOptions) { o.maxConnections = 0 }, "--max-connections 0: give 16 or more"},
		{func(o *serveOptions) { o.maxConnections = 15 }, "--max-connections 15"},
		{func(o *serveOptions) { o.stopTimeout = -time.Second }, "--stop-timeout"},
		{func(o *serveOptions) { o.freezeTimeout = 0 }, "--fork-freeze-timeout"},
		{func(o *serveOptions) { o.defaultDisk = "1KiB" }, "--default-disk"},
		{func(o *serveOptions) { o.defaultDisk = "2PiB" }, "--default-disk"},
		{func(o *serveOptions) { o.maxImageSize = "1KiB" }, "--max-image-size"},
		{func(o *serveOptions) { o.maxImageSize = "0" }, "--max-image-size"},
		{func(o *serveOptions) { o.pullTimeout = 0 }, "--pull-timeout"},
		{func(o *serveOptions) { o.idleTimeout = 0 }, "--idle-timeout"},
		{func(o *serveOptions) { o.bodyTimeout = -time.Second }, "--body-timeout"},
		{func(o *serveOptions) { o.ledgerRetention = -time.Second }, "--ledger-retention"},
		{func(o *serveOptions) { o.maxClientConns = -1 }, "--max-client-conns"},
		{func(o *serveOptions) { o.forkMemory = "foo" }, `--fork-memory "foo": want handoff or pages`},
		{func(o *serveOptions) { o.ledgerMinFree = "lots" }, "--ledger-min-free"},
		{func(o *serveOptions) { o.maxMemory = "1PiB" }, "--max-memory"},
		{func(o *serveOptions) { o.maxCPU = "100000" }, "--max-cpu"},
		{func(o *serveOptions) { o.mtu = 100 }, "--mtu 100"},
		{func(o *serveOptions) { o.mtu = 70000 }, "--mtu 70000"},
		{func(o *serveOptions) { o.allowPrivate = []string{"10.1.0.0/16", "garbage"} }, `--allow-private-egress "garbage"`},
		{func(o *serveOptions) { o.allowPrivate = []string{"10.0.0.1/8"} }, "give 10.0.0.0/8 for the range, or 10.0.0.1/32"},
		{func(o *serveOptions) { o.allowPrivate = []string{"169.254.0.0/16"} }, "link-local"},
		{func(o *serveOptions) { o.allowPrivate = []string{"0.0.0.0/0"} }, "no sandbox reaches those"},
		{func(o *serveOptions) { o.allowPrivate = []string{"8.8.8.0/24"} }, "give ranges inside"},
	} {
		o := base
		tt.set(&o)
		err := serve(context.Background(), &o)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("serve(%+v) = %v, want an error saying %q", o, err, tt.want)
		}
	}
}
