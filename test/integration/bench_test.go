package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// The benchmarks measure shard side by side with the raw runtime (and
// podman, the docker-like tool a user would otherwise reach for) in the same
// run, and report p50/p90 per variant plus the ratio to the raw runtime.
// Run them with a fixed count, e.g.:
//
//	SHARD_INTEGRATION=1 go test ./test/integration -run '^$' -bench . -benchtime 20x
//
// They are measurements, not assertions: nothing here fails on a number.

type samples map[string][]time.Duration

func (s samples) add(k string, d time.Duration) { s[k] = append(s[k], d) }

func pct(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	c := append([]time.Duration(nil), ds...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	i := int(p*float64(len(c)-1) + 0.5)
	return float64(c[i].Microseconds()) / 1000
}

// report prints one line per variant and reports p50/p90 (ms) and the
// ratio of each variant's p50 to base's.
func report(b *testing.B, s samples, base string, order ...string) {
	b.StopTimer()
	for _, k := range order {
		p50, p90 := pct(s[k], 0.5), pct(s[k], 0.9)
		b.ReportMetric(p50, k+"-p50-ms")
		b.ReportMetric(p90, k+"-p90-ms")
		line := fmt.Sprintf("%-28s n=%-3d p50 %8.2f ms  p90 %8.2f ms", k, len(s[k]), p50, p90)
		if base != "" && k != base && pct(s[base], 0.5) > 0 {
			r := p50 / pct(s[base], 0.5)
			b.ReportMetric(r, k+"-ratio")
			line += fmt.Sprintf("  %.2fx %s", r, base)
		}
		fmt.Fprintln(os.Stderr, "BENCH", b.Name(), line)
	}
}

// rawBundle makes a runtime bundle like shard's for sandbox sb (same image
// layers, same spec) with process argv, on a fresh overlay.
func rawBundle(b *testing.B, sb *client.Sandbox, argv ...string) (bundle string, cleanup func()) {
	b.Helper()
	e := need(b)
	cfg, err := os.ReadFile(filepath.Join(e.dataDir, "run", sb.ID, "config.json"))
	if err != nil {
		b.Fatal(err)
	}
	lower := ""
	for _, m := range mounts() {
		if l := m.line; strings.Contains(l, filepath.Join("run", sb.ID, "rootfs")) {
			if i := strings.Index(l, "lowerdir="); i >= 0 {
				lower = strings.SplitN(l[i+len("lowerdir="):], ",", 2)[0]
			}
		}
	}
	if lower == "" {
		b.Fatalf("no overlay for %s", sb.ID)
	}
	dir := b.TempDir()
	for _, d := range []string{"upper", "work", "rootfs"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	if out, err := exec.Command("mount", "-t", "overlay", "overlay", "-o",
		"lowerdir="+lower+",upperdir="+dir+"/upper,workdir="+dir+"/work", dir+"/rootfs").CombinedOutput(); err != nil {
		b.Fatalf("mount: %v %s", err, out)
	}
	// Same spec, but the raw run has its own rootfs, no agent, and a netns
	// made by hand (rawNetns) before each timed run.
	s := string(cfg)
	s = strings.Replace(s, filepath.Join(e.dataDir, "run", sb.ID, "rootfs"), dir+"/rootfs", 1)
	if argv != nil {
		s = strings.Replace(s, `"/.shard/shard",
   "agent"`, `"`+strings.Join(argv, `", "`)+`"`, 1)
	}
	s = strings.Replace(s, `"path": "`+filepath.Join(e.runDir, "netns", sb.ID)+`"`, `"path": "/run/netns/shardbench"`, 1)
	s = strings.ReplaceAll(s, `"/shard/`+sb.ID+`"`, `"/shardbench/`+filepath.Base(dir)+`"`)
	// No memory limit for the raw run: a restore of a large image by hand
	// would otherwise meet the page cache in the cgroup (seen at 1 GiB).
	var spec map[string]any
	if err := json.Unmarshal([]byte(s), &spec); err != nil {
		b.Fatal(err)
	}
	if lx, ok := spec["linux"].(map[string]any); ok {
		if res, ok := lx["resources"].(map[string]any); ok {
			delete(res, "memory")
		}
	}
	out, _ := json.MarshalIndent(spec, "", " ")
	s = string(out)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(s), 0o600); err != nil {
		b.Fatal(err)
	}
	return dir, func() { exec.Command("umount", dir+"/rootfs").Run() }
}

// rawNetns makes by hand what shard makes for a sandbox: a fresh netns with
// a veth end holding an address (untimed: the raw runtime's share is only
// `runsc run`). It returns the clean-up.
func rawNetns(b *testing.B) func() {
	exec.Command("ip", "link", "del", "vshardbench").Run() // a killed run's
	exec.Command("ip", "netns", "del", "shardbench").Run()
	cmds := [][]string{
		{"ip", "netns", "add", "shardbench"},
		{"ip", "link", "add", "vshardbench", "type", "veth", "peer", "name", "eth0", "netns", "shardbench"},
		{"ip", "-n", "shardbench", "addr", "add", "10.99.0.2/24", "dev", "eth0"},
		{"ip", "-n", "shardbench", "link", "set", "eth0", "up"},
		{"ip", "-n", "shardbench", "link", "set", "lo", "up"},
		{"ip", "link", "set", "vshardbench", "up"},
		{"ip", "addr", "add", "10.99.0.1/24", "dev", "vshardbench"},
	}
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %v %s", c, err, out)
		}
	}
	return func() {
		exec.Command("ip", "link", "del", "vshardbench").Run()
		exec.Command("ip", "netns", "del", "shardbench").Run()
	}
}

func timeCmd(b *testing.B, name string, args ...string) time.Duration {
	start := time.Now()
	out, err := exec.Command(name, args...).CombinedOutput()
	d := time.Since(start)
	if err != nil {
		b.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return d
}

// BenchmarkCreateFirstExec: from nothing to the first exec's answer, with a
// cached image, vs the raw runtime running the same bundle (`runsc run` /
// `runc run` of `true`), vs `podman run --rm IMAGE true`.
func BenchmarkCreateFirstExec(b *testing.B) {
	e := need(b)
	ctx := context.Background()
	ref := busybox
	tmpl := map[string]*client.Sandbox{}
	for _, prov := range providers {
		tmpl[prov] = create(b, client.CreateRequest{Image: ref, Provider: prov})
	}
	bundles := map[string]string{}
	for _, prov := range providers {
		dir, cleanup := rawBundle(b, tmpl[prov], "/bin/true")
		b.Cleanup(cleanup)
		bundles[prov] = dir
	}
	podman := podmanImage(b)
	s := samples{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, prov := range providers {
			start := time.Now()
			sb, err := e.c.Create(ctx, client.CreateRequest{Image: ref, Provider: prov})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
				b.Fatal(err)
			}
			s.add("shard-"+prov, time.Since(start))
			b.StopTimer()
			e.c.Remove(ctx, sb.ID, true)
			b.StartTimer()
		}
		id := fmt.Sprintf("rawbench%04d", i)
		b.StopTimer()
		cleanup := rawNetns(b)
		b.StartTimer()
		s.add("raw-runsc", timeCmd(b, "runsc", "--root", filepath.Join(e.dir, "rawrunsc"), "--platform", "systrap",
			"--network", "sandbox", "--overlay2", "none", "run", "--bundle", bundles["gvisor"], id))
		b.StopTimer()
		cleanup()
		cleanup = rawNetns(b)
		b.StartTimer()
		s.add("raw-runc", timeCmd(b, "runc", "--root", filepath.Join(e.dir, "rawrunc"), "run", "--bundle", bundles["runc"], id))
		b.StopTimer()
		cleanup()
		b.StartTimer()
		if podman != "" {
			s.add("podman-run", timeCmd(b, "podman", append(podmanFlags("run", "--rm"), podman, "true")...))
		}
	}
	report(b, s, "raw-runsc", "raw-runsc", "shard-gvisor", "raw-runc", "shard-runc", "podman-run")
	if pct(s["raw-runc"], 0.5) > 0 {
		r := pct(s["shard-runc"], 0.5) / pct(s["raw-runc"], 0.5)
		b.ReportMetric(r, "shard-runc-vs-raw-runc-ratio")
		fmt.Fprintf(os.Stderr, "BENCH %s shard-runc vs raw-runc p50 ratio %.2fx\n", b.Name(), r)
	}
}

// BenchmarkExecTrue: the round trip of `true` in a running sandbox through
// the API (Go client), through the CLI (a new process each time), and with
// raw `runsc exec` / `runc exec` on the very same sandbox; and podman exec.
func BenchmarkExecTrue(b *testing.B) {
	e := need(b)
	ctx := context.Background()
	sbs := map[string]*client.Sandbox{}
	for _, prov := range providers {
		sbs[prov] = create(b, client.CreateRequest{Image: busybox, Provider: prov})
	}
	podman := podmanImage(b)
	ctr := ""
	if podman != "" {
		out, err := exec.Command("podman", append(podmanFlags("run", "-d"), podman, "sleep", "100000")...).CombinedOutput()
		if err != nil {
			b.Fatalf("podman run: %v %s", err, out)
		}
		ctr = strings.TrimSpace(string(out))
		b.Cleanup(func() { exec.Command("podman", "rm", "-f", ctr).Run() })
	}
	s := samples{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, prov := range providers {
			start := time.Now()
			if _, err := e.c.Exec(ctx, sbs[prov].ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
				b.Fatal(err)
			}
			s.add("api-"+prov, time.Since(start))
			s.add("cli-"+prov, timeCmd(b, e.bin, "--socket", e.socket, "exec", sbs[prov].ID, "true"))
		}
		s.add("raw-runsc-exec", timeCmd(b, "runsc", "--root", filepath.Join(e.runDir, "runsc"), "--platform", "systrap",
			"--network", "sandbox", "--overlay2", "none", "exec", sbs["gvisor"].ID, "true"))
		s.add("raw-runc-exec", timeCmd(b, "runc", "--root", filepath.Join(e.runDir, "runc"), "exec", sbs["runc"].ID, "true"))
		if ctr != "" {
			s.add("podman-exec", timeCmd(b, "podman", "exec", ctr, "true"))
		}
	}
	report(b, s, "raw-runsc-exec", "raw-runsc-exec", "api-gvisor", "cli-gvisor", "raw-runc-exec", "api-runc", "cli-runc", "podman-exec")
}

// BenchmarkIdleMemory: resident memory of shard serve with 50 idle gVisor
// sandboxes, and what each idle sandbox holds (its memory cgroup: Sentry,
// gofer and guest).
func BenchmarkIdleMemory(b *testing.B) {
	e := need(b)
	ctx := context.Background()
	const n = 50
	before := rssKiB(e.server.Process.Pid)
	var ids []string
	for i := 0; i < n; i++ {
		sb := create(b, client.CreateRequest{Image: busybox, Memory: []byte(`"128MiB"`)})
		ids = append(ids, sb.ID)
	}
	time.Sleep(3 * time.Second) // let them settle
	after := rssKiB(e.server.Process.Pid)
	var sum int64
	for _, id := range ids {
		v, _ := os.ReadFile("/sys/fs/cgroup/memory/shard/" + id + "/memory.usage_in_bytes")
		x, _ := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
		sum += x
	}
	for i := 0; i < b.N; i++ {
		if _, err := e.c.Exec(ctx, ids[i%n], client.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(before)/1024, "serve-rss-MiB-before")
	b.ReportMetric(float64(after)/1024, "serve-rss-MiB-with-50")
	b.ReportMetric(float64(sum)/n/(1<<20), "per-sandbox-MiB")
	fmt.Fprintf(os.Stderr, "BENCH %s shard serve RSS %.1f MiB before, %.1f MiB with %d idle sandboxes; per idle sandbox (memory cgroup) %.1f MiB\n",
		b.Name(), float64(before)/1024, float64(after)/1024, n, float64(sum)/n/(1<<20))
}

func rssKiB(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(v)
			n, _ := strconv.ParseInt(f[0], 10, 64)
			return n
		}
	}
	return 0
}

// podmanFlags are what podman needs on this host (PLATFORM.md): rlimits
// within the host's hard limits, no network.
func podmanFlags(verb ...string) []string {
	return append(verb, "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096", "--network=none", "--runtime", "runc")
}

// podmanImage pulls the test busybox into podman; "" if podman is missing.
func podmanImage(b *testing.B) string {
	e := need(b)
	if _, err := exec.LookPath("podman"); err != nil {
		fmt.Fprintln(os.Stderr, "BENCH podman not installed: no podman figures")
		return ""
	}
	ref := e.registry + "/busybox:latest"
	if out, err := exec.Command("podman", "pull", "--tls-verify=false", ref).CombinedOutput(); err != nil {
		b.Fatalf("podman pull: %v %s", err, out)
	}
	return ref
}
