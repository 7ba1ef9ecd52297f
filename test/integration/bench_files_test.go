package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/oci"
)

// filesBytes is the size of the file BenchmarkFiles copies in and out.
const filesBytes = 256 << 20

// BenchmarkFiles: `shard cp` of a 256 MiB file of random bytes into a
// running sandbox and back out, through the CLI under test, beside the
// same copy by hand with the raw runtime in the same run, on the same
// sandbox (its shard id is its container id, under the server's --root):
//
//	in:  tar c -C DIR big | RUNTIME exec --user 0:0 --cwd / ID tar x -C /root
//	out: RUNTIME exec ... ID tar c -C /root big | tar x -C DIR
//
// Reports per provider and direction the p50 and p90 ms of each, their
// MB/s (p50), the throughput ratio shard/raw, the CPU per copy (p50) of
// shard serve and of the sandbox's cgroup (the Sentry and gofer, or the
// container's processes: the helper or tar), and shard serve's resident
// memory before the copies and at its peak during them
// (sampled every 20 ms): it should stay flat, not grow with the file.
// The bytes are checked once per run of each provider (in: sha256sum in
// the sandbox; out: compared with the original), outside the timed part.
//
//	SHARD_INTEGRATION=1 go test ./test/integration -run '^$' -bench Files -benchtime 5x
func BenchmarkFiles(b *testing.B) {
	e := need(b)
	dir := filepath.Join(e.dir, "bench-files")
	src := filepath.Join(dir, "big")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	sum := randomFile(b, src, filesBytes)
	b.Cleanup(func() { os.RemoveAll(dir) })
	for _, prov := range providers {
		b.Run(prov, func(b *testing.B) { benchFiles(b, prov, src, sum) })
	}
}

// randomFile writes size random bytes at p and returns their sha256 (hex).
func randomFile(b *testing.B, p string, size int64) string {
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	rng := rand.NewChaCha8([32]byte{byte(time.Now().UnixNano())})
	if _, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(rng, size)); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func benchFiles(b *testing.B, prov, src, sum string) {
	e := need(b)
	ctx := context.Background()
	sb := create(b, client.CreateRequest{Image: busybox, Provider: prov, Memory: jsonRaw("1GiB"), Disk: jsonRaw("1GiB")})
	name := filepath.Base(src)
	out := b.TempDir() // what comes out lands here, as out/big
	got := filepath.Join(out, name)
	in := "/root/" + name
	raw := func(argv ...string) []string {
		if prov == "runc" {
			return append([]string{"runc", "--root", filepath.Join(e.runDir, "runc"), "exec", "--user", "0:0", "--cwd", "/", sb.ID}, argv...)
		}
		return append([]string{"runsc", "--root", filepath.Join(e.runDir, "runsc"), "--platform", "systrap",
			"--network", "sandbox", "--overlay2", "none", "exec", "--user", "0:0", "--cwd", "/", sb.ID}, argv...)
	}
	shardCp := func(from, to string) []string {
		return []string{e.bin, "--socket", e.socket, "cp", from, to}
	}
	rmIn := func() {
		if _, err := e.c.RemoveFile(ctx, sb.ID, in, false); err != nil {
			b.Fatal(err)
		}
	}
	checkIn := func(what string) {
		if s, _, _ := strings.Cut(execOK(b, sb.ID, "sha256sum", in), " "); s != sum {
			b.Fatalf("%s: the sandbox's %s has sha256 %s, the original %s", what, in, s, sum)
		}
	}
	checkOut := func(what string) {
		if err := sameFile(src, got); err != nil {
			b.Fatalf("%s: %v", what, err)
		}
	}

	pid := e.server.Process.Pid
	rssBefore := rssKiB(pid)
	stop := sampleRSS(pid, 20*time.Millisecond)
	cgroup := filepath.Join("/sys/fs/cgroup/cpuacct", oci.CgroupsPath(sb.ID), "cpuacct.usage")
	sandboxCPU := func() time.Duration { return time.Duration(readInt(b, cgroup)) }
	// s: each copy's time; serve, box: the CPU shard serve and the
	// sandbox's cgroup (the Sentry and gofer, or the processes in a runc
	// container) spent on it.
	s, serve, box := samples{}, samples{}, samples{}
	timed := func(k string, run func() time.Duration) {
		c0, x0 := procCPU(pid), sandboxCPU()
		s.add(k, run())
		serve.add(k, procCPU(pid)-c0)
		box.add(k, sandboxCPU()-x0)
	}
	shard := func(k string, argv []string) {
		timed(k, func() time.Duration { return timeCmd(b, argv[0], argv[1:]...) })
	}
	rawPipe := func(k string, from, to []string) {
		timed(k, func() time.Duration { return timePipe(b, from, to) })
	}
	// Each copy starts just after a file of its size was removed where it
	// writes (the sandbox's disk for in, here for out), shard's and the
	// raw one alike. On a VM that hands freed memory back to its host
	// within a second or so (page reporting), 256 MiB written into page
	// cache costs up to a second of faults, into pages just freed a tenth
	// of that: a copy that met the one state and its rival the other would
	// measure that, not shard. Hence a file on both sides to begin with.
	if _, errOut, code := e.cli(b, "", "cp", src, sb.ID+":"+in); code != 0 {
		b.Fatalf("shard cp in: exit %d: %s", code, errOut)
	}
	if err := copyFile(src, got); err != nil {
		b.Fatal(err)
	}
	rmOut := func() {
		if err := os.Remove(got); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		rmIn()
		b.StartTimer()
		shard("in-shard", shardCp(src, sb.ID+":"+in))
		b.StopTimer()
		if i == 0 {
			checkIn("shard cp in")
		}
		rmIn()
		b.StartTimer()
		rawPipe("in-raw", []string{"tar", "c", "-C", filepath.Dir(src), name}, raw("tar", "x", "-C", "/root"))
		b.StopTimer()
		if i == 0 {
			checkIn("raw in")
		}
		rmOut()
		b.StartTimer()
		shard("out-shard", shardCp(sb.ID+":"+in, out))
		b.StopTimer()
		if i == 0 {
			checkOut("shard cp out")
		}
		rmOut()
		b.StartTimer()
		rawPipe("out-raw", raw("tar", "c", "-C", "/root", name), []string{"tar", "x", "-C", out})
		b.StopTimer()
		if i == 0 {
			checkOut("raw out")
		}
		b.StartTimer()
	}
	b.StopTimer()
	rssPeak := stop()

	report(b, s, "", "in-shard", "in-raw", "out-shard", "out-raw")
	for _, dir := range []string{"in", "out"} {
		sh, rw := pct(s[dir+"-shard"], 0.5)/1000, pct(s[dir+"-raw"], 0.5)/1000
		mbShard, mbRaw := float64(filesBytes)/1e6/sh, float64(filesBytes)/1e6/rw
		c := pct(serve[dir+"-shard"], 0.5)
		boxShard, boxRaw := pct(box[dir+"-shard"], 0.5), pct(box[dir+"-raw"], 0.5)
		b.ReportMetric(mbShard, dir+"-shard-MB/s")
		b.ReportMetric(mbRaw, dir+"-raw-MB/s")
		b.ReportMetric(mbShard/mbRaw, dir+"-shard/raw-throughput")
		b.ReportMetric(c, dir+"-shard-serve-cpu-ms")
		b.ReportMetric(boxShard, dir+"-shard-sandbox-cpu-ms")
		b.ReportMetric(boxRaw, dir+"-raw-sandbox-cpu-ms")
		fmt.Fprintf(os.Stderr, "BENCH %s %-3s shard %7.1f MB/s  raw %7.1f MB/s  %.2fx raw throughput  CPU per copy: shard serve %.0f ms, sandbox %.0f ms (raw %.0f ms)\n",
			b.Name(), dir, mbShard, mbRaw, mbShard/mbRaw, c, boxShard, boxRaw)
	}
	b.ReportMetric(float64(rssBefore)/1024, "serve-rss-MiB-before")
	b.ReportMetric(float64(rssPeak)/1024, "serve-rss-MiB-peak")
	fmt.Fprintf(os.Stderr, "BENCH %s shard serve RSS %.1f MiB before the copies, %.1f MiB at their peak\n",
		b.Name(), float64(rssBefore)/1024, float64(rssPeak)/1024)
}

// sampleRSS samples pid's VmRSS every interval until stop, which returns
// the largest seen (KiB).
func sampleRSS(pid int, interval time.Duration) (stop func() int64) {
	var (
		mu  sync.Mutex
		top = rssKiB(pid) // guarded by mu
	)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				v := rssKiB(pid)
				mu.Lock()
				if v > top {
					top = v
				}
				mu.Unlock()
			}
		}
	}()
	return func() int64 {
		close(done)
		<-finished
		mu.Lock()
		defer mu.Unlock()
		return top
	}
}

// timePipe times `from | to`: two processes and a pipe between them (a
// plain one, as a shell makes).
func timePipe(b *testing.B, from, to []string) time.Duration {
	r, w, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	var e1, e2 bytes.Buffer
	c1 := exec.Command(from[0], from[1:]...)
	c1.Stdout, c1.Stderr = w, &e1
	c2 := exec.Command(to[0], to[1:]...)
	c2.Stdin, c2.Stderr = r, &e2
	start := time.Now()
	if err := c1.Start(); err != nil {
		b.Fatal(err)
	}
	if err := c2.Start(); err != nil {
		b.Fatal(err)
	}
	w.Close()
	r.Close()
	err1, err2 := c1.Wait(), c2.Wait()
	d := time.Since(start)
	if err1 != nil || err2 != nil {
		b.Fatalf("%v | %v: %v, %v\n%s\n%s", from, to, err1, err2, e1.String(), e2.String())
	}
	return d
}

// copyFile copies the file src to dst.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// sameFile is cmp: nil when a and b hold the same bytes.
func sameFile(a, b string) error {
	fa, err := os.Open(a)
	if err != nil {
		return err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return err
	}
	defer fb.Close()
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	var off int64
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return fmt.Errorf("%s and %s differ within bytes %d to %d", a, b, off, off+int64(max(na, nb)))
		}
		off += int64(na)
		if ea != nil || eb != nil {
			if ea != eb && !(isEOF(ea) && isEOF(eb)) {
				return fmt.Errorf("%s and %s: %v, %v at byte %d", a, b, ea, eb, off)
			}
			return nil
		}
	}
}

func isEOF(err error) bool { return err == io.EOF || err == io.ErrUnexpectedEOF }
