package main

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/metrics"
	"github.com/useshards/shard/internal/sandbox"
)

// --max-memory, --max-cpu and --max-pids take bounds up to what the host
// can honour, and name the flag when they refuse one.
func TestSandboxLimitsFlags(t *testing.T) {
	host := sandbox.HostLimits()
	tests := []struct {
		name             string
		memory, cpu      string
		pids             int64
		want             string // part of the error; "" for none
		wantMem, wantCPU int64
	}{
		{"host", "host", "host", sandbox.MaxPids, "", 0, 0},
		{"lower", "1GiB", "500m", 1000, "", 1 << 30, 500},
		{"memory past the host", "1PiB", "host", sandbox.MaxPids, "--max-memory", 0, 0},
		{"memory not a size", "lots", "host", sandbox.MaxPids, "--max-memory", 0, 0},
		{"cpu past the host", "host", "100000", sandbox.MaxPids, "--max-cpu", 0, 0},
		{"pids past the kernel's", "host", "host", 1000000000, "--max-pids", 0, 0},
		{"pids too few", "host", "host", 1, "--max-pids", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := sandboxLimits(&serveOptions{maxMemory: tt.memory, maxCPU: tt.cpu, maxPids: tt.pids}, host)
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("sandboxLimits = %v, want an error naming %s", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if l.MemoryBytes != tt.wantMem || l.CPUMillis != tt.wantCPU || l.Pids != tt.pids {
				t.Errorf("sandboxLimits = %+v, want memory %d cpu %d pids %d", l, tt.wantMem, tt.wantCPU, tt.pids)
			}
			if got := host.Lower(l); got.MemoryBytes > host.MemoryBytes || got.CPUMillis > host.CPUMillis {
				t.Errorf("the limits %+v raise the host's %+v", got, host)
			}
		})
	}
}

// --ledger-min-free: auto is the default floor (0), 0 turns it off (< 0),
// a size is taken as given, however large.
func TestLedgerFloorFlag(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  bool
	}{
		{"auto", 0, false},
		{"0", -1, false},
		{"2GiB", 2 << 30, false},
		{"1PiB", 1 << 50, false},
		{"lots", 0, true},
		{"-1GiB", 0, true},
		{"", 0, true},
	}
	for _, tt := range tests {
		got, err := ledgerFloorFlag(tt.in)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("ledgerFloorFlag(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.err)
		}
		if err != nil && !strings.Contains(err.Error(), "--ledger-min-free") {
			t.Errorf("ledgerFloorFlag(%q) = %v: the error does not name the flag", tt.in, err)
		}
	}
}

// --metrics-listen on loopback answers a scraper's request (to an address
// or localhost), never one to a name, which only a web page rebinding its
// own name to 127.0.0.1 would send (DNS rebinding).
func TestMetricsOnlyRefusesRebinding(t *testing.T) {
	m := metrics.New("")
	for _, tt := range []struct {
		host     string
		loopback bool
		want     int
	}{
		{"127.0.0.1:9470", true, http.StatusOK},
		{"[::1]:9470", true, http.StatusOK},
		{"localhost:9470", true, http.StatusOK},
		{"LOCALHOST", true, http.StatusOK},
		{"attacker.example:9470", true, http.StatusMisdirectedRequest},
		{"localhost.attacker.example", true, http.StatusMisdirectedRequest},
		{"", true, http.StatusMisdirectedRequest},
		{"prom-target.lan:9470", false, http.StatusOK}, // not loopback: warned of, served to any name
	} {
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		r.Host = tt.host
		w := httptest.NewRecorder()
		metricsOnly(m, tt.loopback).ServeHTTP(w, r)
		if w.Code != tt.want {
			t.Errorf("Host %q (loopback %v): %d, want %d", tt.host, tt.loopback, w.Code, tt.want)
		}
	}
}

// config reads every flag against the host's facts, opens nothing, and
// refuses a bad flag by its name. The facts are a test's own: the same
// flags give the same config on any host.
func TestConfig(t *testing.T) {
	host := hostFacts{limits: sandbox.Limits{MemoryBytes: 8 << 30, MemoryFrom: "a test host", CPUMillis: 4000, Pids: sandbox.MaxPids},
		conntrackMax: 262144}
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	defaults := func() *serveOptions {
		o := &serveOptions{}
		newServeCmdInto(o) // the flags' defaults
		return o
	}
	tests := []struct {
		name  string
		edit  func(*serveOptions)
		want  string // part of the error; "" for none
		check func(*testing.T, *config)
	}{
		{"defaults", func(*serveOptions) {}, "", func(t *testing.T, c *config) {
			if c.storageSize != 4<<30 || c.storageMax != 0 || c.reserve != 2<<30 || c.ledgerFloor != 256<<20 || c.defaultDisk != 2<<30 {
				t.Errorf("sizes: %+v", c)
			}
			if c.subnet.String() != "10.88.0.0/16" || c.level != slog.LevelInfo || c.conns.TableMax != 262144 {
				t.Errorf("subnet %s level %s conns %+v", c.subnet, c.level, c.conns)
			}
		}},
		{"reserve 0 keeps nothing, ledger auto follows it", func(o *serveOptions) { o.reserve = "0"; o.ledgerMinFree = "auto" }, "", func(t *testing.T, c *config) {
			if c.reserve != -1 || c.ledgerFloor != -1 {
				t.Errorf("reserve %d ledger floor %d, want -1 -1", c.reserve, c.ledgerFloor)
			}
		}},
		{"storage auto is the first size", func(o *serveOptions) { o.storageSize = "auto" }, "", func(t *testing.T, c *config) {
			if c.storageSize != 4<<30 {
				t.Errorf("storage size %d", c.storageSize)
			}
		}},
		{"log level", func(o *serveOptions) { o.logLevel = "loud" }, "--log-level", nil},
		{"log format", func(o *serveOptions) { o.logFormat = "xml" }, "--log-format", nil},
		{"subnet v6", func(o *serveOptions) { o.subnet = "fd00::/64" }, "--subnet", nil},
		{"subnet too small", func(o *serveOptions) { o.subnet = "10.0.0.0/30" }, "--subnet", nil},
		{"private egress not a CIDR", func(o *serveOptions) { o.allowPrivate = []string{"lan"} }, "--allow-private-egress", nil},
		{"private egress host bits", func(o *serveOptions) { o.allowPrivate = []string{"10.1.2.3/16"} }, "10.1.0.0/16", nil},
		{"mtu", func(o *serveOptions) { o.mtu = 100 }, "--mtu", nil},
		{"connections", func(o *serveOptions) { o.maxConnections = 1 }, "--max-connections", nil},
		{"default disk", func(o *serveOptions) { o.defaultDisk = "1KiB" }, "--default-disk", nil},
		{"image size", func(o *serveOptions) { o.maxImageSize = "1KiB" }, "--max-image-size", nil},
		{"storage size", func(o *serveOptions) { o.storageSize = "1MiB" }, "--storage-size", nil},
		{"storage max below size", func(o *serveOptions) { o.storageMax = "1GiB" }, "--storage-max", nil},
		{"reserve", func(o *serveOptions) { o.reserve = "much" }, "--reserve", nil},
		{"sandboxes", func(o *serveOptions) { o.maxSandboxes = -1 }, "--max-sandboxes", nil},
		{"overcommit", func(o *serveOptions) { o.memoryOvercommit = 0.01 }, "--memory-overcommit", nil},
		{"stop timeout", func(o *serveOptions) { o.stopTimeout = -1 }, "--stop-timeout", nil},
		{"pull timeout", func(o *serveOptions) { o.pullTimeout = 0 }, "--pull-timeout", nil},
		{"freeze timeout", func(o *serveOptions) { o.freezeTimeout = 0 }, "--fork-freeze-timeout", nil},
		{"idle timeout", func(o *serveOptions) { o.idleTimeout = 0 }, "--idle-timeout", nil},
		{"retention", func(o *serveOptions) { o.ledgerRetention = -1 }, "--ledger-retention", nil},
		{"client conns", func(o *serveOptions) { o.maxClientConns = -1 }, "--max-client-conns", nil},
		{"fork memory", func(o *serveOptions) { o.forkMemory = "teleport" }, "--fork-memory", nil},
		{"ledger floor", func(o *serveOptions) { o.ledgerMinFree = "lots" }, "--ledger-min-free", nil},
		{"memory past the host", func(o *serveOptions) { o.maxMemory = "16GiB" }, "--max-memory", nil},
		{"cluster flags alone", func(o *serveOptions) { o.cluster.node = "a" }, "--cluster-etcd", nil},
		{"bridge too long", func(o *serveOptions) { o.bridge = "a-bridge-too-long" }, "--bridge", nil},
		{"bridge a path", func(o *serveOptions) { o.bridge = "../x" }, "--bridge", nil},
		{"provider", func(o *serveOptions) { o.defaultProvider = "docker" }, "--default-provider", nil},
		{"platform", func(o *serveOptions) { o.platform = "kvm" }, "--platform", nil},
		{"allowed registry a URL", func(o *serveOptions) { o.allowed = []string{"http://x"} }, "--allowed-registry", nil},
		{"insecure registry a path", func(o *serveOptions) { o.insecure = []string{"a/b"} }, "--insecure-registry", nil},
		{"run dir in the data dir", func(o *serveOptions) { o.dataDir, o.runDir = "/srv/shard", "/srv/shard/run" },
			"--run-dir /srv/shard/run is inside --data-dir /srv/shard", nil},
		{"run dir is the data dir", func(o *serveOptions) { o.dataDir, o.runDir = "/srv/shard", "/srv/shard/" },
			"--data-dir and --run-dir are the same directory, /srv/shard", nil},
		{"data dir in the run dir", func(o *serveOptions) { o.dataDir = "/run/shard/data" },
			"--data-dir /run/shard/data is inside --run-dir /run/shard", nil},
		{"data dir in the run dir, relative", func(o *serveOptions) { o.runDir, o.dataDir = "x", "x/../x/data" },
			"--data-dir " + cwd + "/x/data is inside --run-dir " + cwd + "/x", nil},
		{"image ram dir in the data dir", func(o *serveOptions) { o.imageRAM = "/var/lib/shard/ram" },
			"--image-ram-dir /var/lib/shard/ram is inside --data-dir /var/lib/shard", nil},
		{"image ram dir holds the run dir", func(o *serveOptions) { o.imageRAM = "/run" },
			"--run-dir /run/shard is inside --image-ram-dir /run", nil},
		{"image ram dir is the root", func(o *serveOptions) { o.imageRAM = "/" }, "is inside --image-ram-dir /", nil},
		{"dirs side by side", func(o *serveOptions) {
			o.dataDir, o.runDir, o.imageRAM = "/srv/shard", "/srv/shard-run", "/dev/shm/shard"
		}, "", nil},
		{"image ram dir none", func(o *serveOptions) { o.imageRAM = "none" }, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := defaults()
			tt.edit(o)
			before := *o
			c, err := o.config(host)
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("config = %v, want an error naming %s", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.storageSize != before.storageSize || o.cluster.listen != before.cluster.listen {
				t.Errorf("config changed the flags it read")
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
	t.Run("conntrack unreadable", func(t *testing.T) {
		h := host
		h.conntrackMax, h.conntrackErr = 0, errors.New("no such file")
		c, err := defaults().config(h)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.notes) == 0 || !strings.Contains(c.notes[0], "conntrack") {
			t.Errorf("notes %q, want one about the conntrack table", c.notes)
		}
	})
}

// The directory check follows symbolic links: a --run-dir through a link
// to the data directory is inside it, however it is spelled, and a link to
// a directory of its own is not.
func TestConfigDirsThroughLinks(t *testing.T) {
	tmp := t.TempDir()
	if r, err := filepath.EvalSymlinks(tmp); err == nil {
		tmp = r // the temporary directory may itself be under a link
	}
	for _, d := range []string{"d5", "other"} {
		if err := os.Mkdir(filepath.Join(tmp, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{"plink": "d5", "olink": "other", "dlink": "later", "rel": "../" + filepath.Base(tmp) + "/./d5"}
	for link, target := range links {
		if err := os.Symlink(target, filepath.Join(tmp, link)); err != nil {
			t.Fatal(err)
		}
	}
	host := hostFacts{limits: sandbox.Limits{MemoryBytes: 8 << 30, CPUMillis: 4000, Pids: sandbox.MaxPids}, conntrackMax: 262144, resolve: resolveDir}
	at := func(p string) string { return filepath.Join(tmp, p) }
	tests := []struct {
		name, data, run string
		want            string // part of the error; "" for none
	}{
		{"run dir through a link to the data dir", "d5", "plink/run",
			"--run-dir " + at("plink/run") + " (" + at("d5/run") + ") is inside --data-dir " + at("d5")},
		{"deeper, not there yet", "d5", "plink/a/b", "is inside --data-dir " + at("d5")},
		{"the link itself", "d5", "plink", "are the same directory, " + at("d5")},
		{"data dir through the link, run dir as given", "plink/data", "d5", "--data-dir " + at("plink/data") + " (" + at("d5/data") + ") is inside --run-dir " + at("d5")},
		{"a relative link", "d5", "rel/run", "is inside --data-dir " + at("d5")},
		{"a link to a directory of its own", "d5", "olink/run", ""},
		{"a link that leads nowhere yet", "later", "dlink/run", ""}, // the daemon checks again once it made them
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := &serveOptions{}
			newServeCmdInto(o)
			o.dataDir, o.runDir, o.imageRAM = at(tt.data), at(tt.run), "none"
			_, err := o.config(host)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("config = %v, want an error with %q", err, tt.want)
			}
		})
	}
	// What the daemon checks once it has made the directories: the link
	// that led nowhere leads into the data directory now.
	if err := os.Mkdir(at("later"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := checkDirs(&serveOptions{dataDir: at("later"), runDir: at("dlink/run"), imageRAM: "none"}, resolveDir)
	if err == nil || !strings.Contains(err.Error(), "is inside --data-dir "+at("later")) {
		t.Errorf("checkDirs once the link leads somewhere = %v, want the run dir inside the data dir", err)
	}
}

// resolveDir resolves the longest existing ancestor and keeps the rest.
func TestResolveDir(t *testing.T) {
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(tmp, "a/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(tmp, "a/b"), filepath.Join(tmp, "l")); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"a/b":     "a/b",
		"l":       "a/b",
		"l/c/d":   "a/b/c/d",
		"x/y":     "x/y",
		"a/b/c/l": "a/b/c/l", // a name below one that is not there is kept
	} {
		got, err := resolveDir(filepath.Join(tmp, in))
		if err != nil || got != filepath.Join(tmp, want) {
			t.Errorf("resolveDir(%s) = %q, %v; want %q", in, got, err, filepath.Join(tmp, want))
		}
	}
	if got, err := resolveDir("/"); err != nil || got != "/" {
		t.Errorf("resolveDir(/) = %q, %v", got, err)
	}
}
