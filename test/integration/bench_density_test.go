package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/oci"
)

// BenchmarkDensity: what N idle gVisor sandboxes (busybox, --memory
// 128MiB, a 16MiB disk: every disk bound is reserved in full from the
// store) cost the host, and whether create, exec and fork stay as fast as
// with one. The sandboxes are added one by one up to each N of
// SHARD_BENCH_DENSITY_N (default 1,50,100,200); at each N it measures:
//
//   - host CPU busy (all cores, /proc/stat) over SHARD_BENCH_DENSITY_IDLE_SECONDS
//     (default 10) while they idle, and shard serve's CPU in that window;
//   - create → first exec of SHARD_BENCH_DENSITY_CREATES (default 5) new
//     sandboxes like them, each removed again (N stays N);
//   - `exec true` through the API, SHARD_BENCH_DENSITY_EXECS (default 20)
//     calls over different sandboxes, and raw `runsc exec true` on the same
//     sandboxes (the runtime's own figure at this N);
//   - fork → first exec in the fork of a sandbox whose process holds 16 MiB,
//     SHARD_BENCH_DENSITY_FORKS (default 5) times (forks and their
//     checkpoints removed; the holder is made for this and removed after);
//   - shard serve's RSS, and memory per idle sandbox: the sum of their
//     memory cgroups over N, plus what their host processes hold outside
//     that cgroup (PSS), plus the host's own view (MemTotal-MemAvailable,
//     its growth since before the first sandbox, over N: the whole host,
//     kernel objects such as netns, veths and loop devices included; noisy
//     on a host that does other work);
//
// and the ratios of create, exec and fork p50 to N=1's. Then it removes
// them all and fails if anything of them is left: a record, a runsc
// process, a veth or netns, a mount or loop device, a cgroup, a file in
// the store. Run it with:
//
//	SHARD_INTEGRATION=1 go test ./test/integration -run '^$' -bench Density -benchtime 1x -timeout 2h
//
// (About 6 minutes at the default Ns. 200 sandboxes need a store of about
// 4.5GiB, allocated in full; on a disk with less free than that plus
// the image floor, run it with TMPDIR=/dev/shm SHARD_IT_STORAGE_MAX=5GiB.)
//
// A measurement (apart from the clean-up check): nothing fails on a number.
func BenchmarkDensity(b *testing.B) {
	e := need(b)
	ctx := context.Background()
	ns := densityNs(b)
	idle := time.Duration(envInt("SHARD_BENCH_DENSITY_IDLE_SECONDS", 10)) * time.Second
	nCreate := envInt("SHARD_BENCH_DENSITY_CREATES", 5)
	nExec := envInt("SHARD_BENCH_DENSITY_EXECS", 20)
	nFork := envInt("SHARD_BENCH_DENSITY_FORKS", 5)
	req := client.CreateRequest{Image: busybox, Provider: "gvisor", Memory: jsonRaw("128MiB"), Disk: jsonRaw("16MiB")}
	runsc := func(args ...string) []string {
		return append([]string{"--root", filepath.Join(e.runDir, "runsc"), "--platform", "systrap", "--network", "sandbox", "--overlay2", "none"}, args...)
	}

	d := &density{e: e, all: map[string]bool{}}
	b.Cleanup(func() { d.removeAll(ctx) })
	hostUsed0, slab0 := hostUsedKiB(), meminfoKiB("SUnreclaim")
	var base samples // N=1's (the first N's) create, exec, fork
	for _, n := range ns {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			// Fill up to n, one at a time; the creates on the way are
			// figures too (how create grows between two Ns).
			fill := samples{}
			for len(d.idle) < n {
				start := time.Now()
				sb := d.create(b, req)
				if _, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
					b.Fatalf("first exec in %s (sandbox %d): %v", sb.ID, len(d.idle)+1, err)
				}
				fill.add("fill-create-exec", time.Since(start))
				d.idle = append(d.idle, sb.ID)
			}
			time.Sleep(3 * time.Second) // let the last ones settle
			s := samples{}

			// Idle: the host's CPU and shard serve's.
			// The sandboxes' own (their cpuacct cgroups: Sentry, gofer,
			// guest) tells them from whatever else the host does.
			serve := e.server.Process.Pid
			sbCPU := func() (ns int64) {
				for _, id := range d.idle {
					ns += readInt(b, "/sys/fs/cgroup/cpuacct/shard/"+id+"/cpuacct.usage")
				}
				return ns
			}
			busy0, total0 := hostCPU(b)
			sc0, sb0, t0 := procCPU(serve), sbCPU(), time.Now()
			time.Sleep(idle)
			busy1, total1 := hostCPU(b)
			sc1, sb1, el := procCPU(serve), sbCPU(), time.Since(t0)
			hostPct := float64(busy1-busy0) / float64(total1-total0) * 100
			servePct := (sc1 - sc0).Seconds() / el.Seconds() * 100
			sbPct := float64(sb1-sb0) / float64(el.Nanoseconds()) * 100 // of one core, all of them

			// Memory, while they idle.
			rss := float64(rssKiB(serve)) / 1024
			var cg int64
			for _, id := range d.idle {
				cg += readInt(b, "/sys/fs/cgroup/memory/shard/"+id+"/memory.usage_in_bytes")
			}
			outside, inside, procs := d.processes(b)
			cgPer := float64(cg) / float64(n) / (1 << 20)
			outPer := float64(outside) / float64(n) / 1024
			hostPer := float64(hostUsedKiB()-hostUsed0) / float64(n) / 1024
			slabPer := float64(meminfoKiB("SUnreclaim")-slab0) / float64(n) / 1024

			// Create → first exec of sandboxes like them, removed again.
			for i := 0; i < nCreate; i++ {
				start := time.Now()
				sb := d.create(b, req)
				if _, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
					b.Fatal(err)
				}
				s.add("create-exec", time.Since(start))
				d.remove(b, sb.ID)
			}

			// exec true over different sandboxes, and runsc exec on them.
			for i := 0; i < nExec; i++ {
				id := d.idle[i*len(d.idle)/nExec]
				start := time.Now()
				if _, err := e.c.Exec(ctx, id, client.ExecRequest{Argv: []string{"true"}}); err != nil {
					b.Fatal(err)
				}
				s.add("exec-true", time.Since(start))
			}
			for i := 0; i < min(nExec, 5); i++ {
				id := d.idle[i*len(d.idle)/min(nExec, 5)]
				s.add("raw-runsc-exec", timeCmd(b, "runsc", runsc("exec", id, "true")...))
			}

			// Fork of a sandbox holding 16 MiB.
			if nFork > 0 {
				h := d.holder(b, 16)
				for i := 0; i < nFork; i++ {
					start := time.Now()
					f, err := e.c.Fork(ctx, h, client.ForkRequest{})
					if err != nil {
						b.Fatal(err)
					}
					d.all[f.ID] = true
					if _, err := e.c.Exec(ctx, f.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
						b.Fatal(err)
					}
					s.add("fork-exec", time.Since(start))
					d.remove(b, f.ID)
				}
				if cks, err := e.c.Checkpoints(ctx, h); err == nil {
					for _, ck := range cks {
						e.c.RemoveCheckpoint(ctx, ck.ID)
					}
				}
				d.remove(b, h)
			}

			report(b, fill, "", "fill-create-exec")
			report(b, s, "", "create-exec", "exec-true", "raw-runsc-exec", "fork-exec")
			b.ReportMetric(hostPct, "host-busy-%")
			b.ReportMetric(servePct, "serve-cpu-%")
			b.ReportMetric(sbPct, "sandboxes-cpu-%")
			b.ReportMetric(sbPct/float64(n), "cpu-%/sandbox")
			b.ReportMetric(slabPer, "kernel-slab-MiB/sandbox")
			b.ReportMetric(rss, "serve-rss-MiB")
			b.ReportMetric(cgPer, "cgroup-MiB/sandbox")
			b.ReportMetric(outPer, "outside-cgroup-MiB/sandbox")
			b.ReportMetric(cgPer+outPer, "total-MiB/sandbox")
			b.ReportMetric(hostPer, "host-MiB/sandbox")
			fmt.Fprintf(os.Stderr, "BENCH %s idle: host %.2f%% busy (all cores); the %d sandboxes %.2f%% of a core (%.4f%% each), shard serve %.2f%%, over %s\n",
				b.Name(), hostPct, n, sbPct, sbPct/float64(n), servePct, el.Round(time.Second))
			fmt.Fprintf(os.Stderr, "BENCH %s memory: shard serve RSS %.1f MiB; per idle sandbox %.1f MiB in its memory cgroup + %.1f MiB outside it (PSS of %d of its %d host processes) = %.1f MiB; host used grew %.1f MiB per sandbox, unreclaimable kernel slab %.2f MiB per sandbox\n",
				b.Name(), rss, cgPer, outPer, procs-inside, procs, cgPer+outPer, hostPer, slabPer)
			if base == nil {
				base = s
			}
			for _, k := range []string{"create-exec", "exec-true", "raw-runsc-exec", "fork-exec"} {
				if p := pct(base[k], 0.5); p > 0 && len(s[k]) > 0 {
					r := pct(s[k], 0.5) / p
					b.ReportMetric(r, k+"-vs-first-N")
					fmt.Fprintf(os.Stderr, "BENCH %s %s p50 %.2f ms, %.2fx of N=%d's\n", b.Name(), k, pct(s[k], 0.5), r, ns[0])
				}
			}
		})
		if b.Failed() {
			return
		}
	}
	if b.Failed() {
		return
	}
	d.removeAll(ctx)
	if left := d.leftovers(); len(left) > 0 {
		b.Fatalf("left after removing every sandbox:\n  %s", strings.Join(left, "\n  "))
	}
	fmt.Fprintf(os.Stderr, "BENCH %s removed %d sandboxes (forks and holders included): nothing left\n", b.Name(), len(d.all))
}

// density holds the benchmark's sandboxes.
type density struct {
	e    *env
	idle []string        // the idle ones, in order
	all  map[string]bool // every one made (for the clean-up check)
}

func (d *density) create(b *testing.B, req client.CreateRequest) *client.Sandbox {
	sb, err := d.e.c.Create(context.Background(), req)
	if err != nil {
		b.Fatalf("create (with %d idle): %v", len(d.idle), err)
	}
	d.all[sb.ID] = true
	return sb
}

func (d *density) remove(b *testing.B, id string) {
	if err := d.e.c.Remove(context.Background(), id, true); err != nil {
		b.Fatalf("remove %s: %v", id, err)
	}
}

// holder makes a python sandbox whose process holds mib MiB resident and
// then sleeps (quiet: BenchmarkFork's holder ticks every millisecond).
func (d *density) holder(b *testing.B, mib int) string {
	sb := d.create(b, client.CreateRequest{Image: python, Provider: "gvisor", Memory: []byte(fmt.Sprintf(`"%dMiB"`, 2*mib+512))})
	execOK(b, sb.ID, "sh", "-c", fmt.Sprintf(`nohup python3 -c '
import os, time
x = bytearray(os.urandom(%d << 20))
open("/tmp/held", "w").close()
time.sleep(10**6)' >/dev/null 2>&1 &`, mib))
	waitFile(b, sb.ID, "/tmp/held")
	return sb.ID
}

func (d *density) removeAll(ctx context.Context) {
	for id := range d.all {
		d.e.c.Remove(ctx, id, true)
		if cks, err := d.e.c.Checkpoints(ctx, id); err == nil {
			for _, ck := range cks {
				d.e.c.RemoveCheckpoint(ctx, ck.ID)
			}
		}
	}
	d.idle = nil
}

// processes finds the host processes of the idle sandboxes (their id in
// the command line), and sums the PSS of those outside the sandbox's
// memory cgroup (KiB).
func (d *density) processes(b *testing.B) (outsideKiB int64, inside, total int) {
	ids := map[string]bool{}
	for _, id := range d.idle {
		ids[id] = true
	}
	for pid, id := range pidsOf(ids) {
		total++
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		in := false
		for _, l := range strings.Split(string(cg), "\n") {
			if f := strings.SplitN(l, ":", 3); len(f) == 3 && strings.Contains(","+f[1]+",", ",memory,") {
				in = f[2] == oci.CgroupsPath(id) || strings.HasPrefix(f[2], oci.CgroupsPath(id)+"/")
			}
		}
		if in {
			inside++
			continue
		}
		outsideKiB += pssKiB(pid)
	}
	return
}

// pidsOf maps the host processes whose command line names one of ids to
// that id.
func pidsOf(ids map[string]bool) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		for _, arg := range strings.Split(string(cmd), "\x00") {
			for id := range ids {
				if strings.Contains(arg, id) {
					out[pid] = id
				}
			}
		}
	}
	return out
}

func pssKiB(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pss:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return 0
}

// leftovers lists what is left of the benchmark's sandboxes on the host.
func (d *density) leftovers() []string {
	// A runtime's process or cgroup may take a moment to go after the
	// answer: look a few times before calling it left.
	var left []string
	for try := 0; try < 20; try++ {
		left = d.lookForLeftovers()
		if len(left) == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	return left
}

func (d *density) lookForLeftovers() []string {
	e := d.e
	var left []string
	if all, err := e.c.List(context.Background()); err != nil {
		left = append(left, "list: "+err.Error())
	} else {
		for _, sb := range all {
			left = append(left, fmt.Sprintf("sandbox %s (%s), state %s", sb.ID, sb.Name, sb.State))
		}
	}
	for pid, id := range pidsOf(d.all) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		left = append(left, fmt.Sprintf("process %d of %s: %s", pid, id, strings.ReplaceAll(string(cmd), "\x00", " ")))
	}
	if out, err := exec.Command("ip", "-o", "link", "show", "master", e.bridge).Output(); err == nil {
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l != "" {
				left = append(left, "veth on "+e.bridge+": "+l)
			}
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(e.runDir, "netns")); len(ents) > 0 {
		for _, ent := range ents {
			left = append(left, "netns "+ent.Name())
		}
	}
	for _, mp := range e.sandboxMounts() {
		left = append(left, "mount "+mp)
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, l := range loops {
		bf, _ := os.ReadFile(l)
		for id := range d.all {
			if strings.Contains(string(bf), id) {
				left = append(left, "loop device "+filepath.Base(filepath.Dir(filepath.Dir(l)))+" on "+strings.TrimSpace(string(bf)))
			}
		}
	}
	for id := range d.all {
		if cgs, _ := filepath.Glob("/sys/fs/cgroup/*/shard/" + id); len(cgs) > 0 {
			left = append(left, "cgroups "+strings.Join(cgs, " "))
		}
		for _, p := range []string{
			filepath.Join(e.dataDir, "storage", "sandboxes", id+".img"),
			filepath.Join(e.dataDir, "storage", "mnt", id),
			filepath.Join(e.dataDir, "run", id),
		} {
			if _, err := os.Stat(p); err == nil {
				left = append(left, "file "+p)
			}
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(e.runDir, "runsc")); len(ents) > 0 {
		for _, ent := range ents {
			for id := range d.all {
				if strings.Contains(ent.Name(), id) {
					left = append(left, "runsc state "+ent.Name())
				}
			}
		}
	}
	return left
}

// densityNs is SHARD_BENCH_DENSITY_N (default 1,50,100,200), increasing.
func densityNs(b *testing.B) []int {
	v := envOr("SHARD_BENCH_DENSITY_N", "1,50,100,200")
	var ns []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || (len(ns) > 0 && n <= ns[len(ns)-1]) {
			b.Fatalf("SHARD_BENCH_DENSITY_N=%q: want increasing counts from 1, e.g. 1,50,100,200", v)
		}
		ns = append(ns, n)
	}
	return ns
}

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v >= 0 {
		return v
	}
	return def
}

// hostCPU is the host's busy and total CPU time so far (all cores, in
// clock ticks): busy is all but idle and iowait.
func hostCPU(b *testing.B) (busy, total int64) {
	f, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(f), "\n")
	fs := strings.Fields(line)
	if len(fs) < 6 || fs[0] != "cpu" {
		b.Fatalf("/proc/stat: %q", line)
	}
	// user nice system idle iowait irq softirq steal (guest counted in user)
	for i, v := range fs[1:] {
		if i >= 8 {
			break
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy, total
}

// meminfoKiB is a field of /proc/meminfo.
func meminfoKiB(field string) int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return 0
}

// hostUsedKiB is MemTotal - MemAvailable: what the host holds that it
// could not hand out without swapping or killing.
func hostUsedKiB() int64 { return meminfoKiB("MemTotal") - meminfoKiB("MemAvailable") }
