package integration

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

const (
	rtMaxSize = 64 << 20
	rtBatch   = 6 // round trips between a stop and a start
	// rtBatchBytes bounds what they write, within the smaller disk.
	rtBatchBytes = 160 << 20
)

// rtTrip is one round trip: a file of size bytes made from seed, written
// and read back by one way.
type rtTrip struct {
	n     int
	prov  string
	size  int64
	seed  uint64
	way   string
	write string // the way's variant that writes
	read  string // and reads
	state string // running or stopped
	path  string // in the sandbox
	src   string // on the host
	sum   [32]byte
}

func (r *rtTrip) String() string {
	return fmt.Sprintf("#%d %s %s %s/%s/%s %d bytes (seed %d)", r.n, r.prov, r.state, r.way, r.write, r.read, r.size, r.seed)
}

// rtProblem is a round trip that went wrong: a failure, or bytes that
// differ (mismatch says how).
type rtProblem struct {
	trip     *rtTrip
	stage    string // write, inside, read, cross-read..., cross-inside
	err      error
	mismatch string // "" for a failure that is no mismatch
}

// rtWay moves files one way: its variants write and read differently
// (a length sent or not, pieces of random sizes, a buffer reused...).
type rtWay interface {
	writeVariants() []string
	readVariants() []string
	write(ctx context.Context, sb, path, src, variant string, seed uint64) (int64, error)
	read(ctx context.Context, sb, path, dst, variant string, seed uint64) (int64, error)
}

var rtWays = []string{"cli", "go", "python", "typescript"}

// rtDisk is each provider's sandbox's disk: ext4 makes a filesystem under
// 512MiB with 1KiB blocks (the suite's default disk, and the SDK test's
// sandbox that once read back zeros) and a bigger one with 4KiB blocks.
var rtDisk = map[string]string{"gvisor": "256MiB", "runc": "1GiB"}

// TestFilesRoundTrips: round trips of files through every way in and out
// of a sandbox: the CLI (shard write, cat, cp), the Go client and both
// SDKs, on running and stopped sandboxes of both providers, files of random
// sizes (0 B to 64 MiB) sent and read in random pieces, with one CPU kept
// busy. Each file is checked three times: by sha256sum inside the sandbox
// when it runs (so a mismatch says whether the write or the read went
// wrong), read back the way it was written, and read again by another way
// after the sandbox was stopped or started (what one side of a sandbox
// wrote, the other side reads). A mismatch says where the bytes first
// differ and whether they are zeros from there on. No mismatch, and no
// failure, is allowed.
//
// SHARD_FILES_ROUNDTRIPS=N runs N round trips (the suite's default is 48;
// the benchmark-style run is 1000); SHARD_FILES_ROUNDTRIPS_SEED repeats a
// run's choices; SHARD_FILES_ROUNDTRIPS_WORKERS is how many go at once (2).
func TestFilesRoundTrips(t *testing.T) {
	e := need(t)
	n, _ := strconv.Atoi(envOr("SHARD_FILES_ROUNDTRIPS", "48"))
	workers, _ := strconv.Atoi(envOr("SHARD_FILES_ROUNDTRIPS_WORKERS", "2"))
	seed, err := strconv.ParseUint(envOr("SHARD_FILES_ROUNDTRIPS_SEED", strconv.FormatInt(time.Now().UnixNano(), 10)), 10, 64)
	if err != nil || n < 1 || workers < 1 {
		t.Fatalf("SHARD_FILES_ROUNDTRIPS=%d, _WORKERS=%d, _SEED: %v", n, workers, err)
	}
	t.Logf("%d round trips, %d at once, seed %d (SHARD_FILES_ROUNDTRIPS_SEED repeats it)", n, workers, seed)
	r := &rtRun{t: t, e: e, workers: workers, dir: t.TempDir(), ways: rtStartWays(t, workers)}
	busy(t)
	byProv := r.plan(n, seed)
	start := time.Now()
	for _, prov := range providers {
		if trips := byProv[prov]; len(trips) > 0 {
			r.provider(prov, trips)
		}
	}
	t.Logf("%s", rtSummary(byProv, r.problems, r.moved, r.crossed, time.Since(start)))
}

// rtRun is one run of TestFilesRoundTrips.
type rtRun struct {
	t       *testing.T
	e       *env
	workers int
	dir     string             // the files on the host
	ways    []map[string]rtWay // each worker's: an SDK's driver serves one job at a time

	mu       sync.Mutex
	problems []rtProblem // guarded by mu
	moved    int64       // bytes written and read back; guarded by mu
	crossed  int64       // bytes read again after a stop or start; guarded by mu
}

// rtStartWays starts each worker's ways: the CLI, the Go client, and a
// driver of each SDK (testdata/roundtrip).
func rtStartWays(t *testing.T, workers int) []map[string]rtWay {
	e := need(t)
	tsDir := filepath.Join(e.root, "sdk", "typescript")
	buildTypeScriptSDK(t, tsDir)
	env := append(sdkServerEnv(t), "PYTHONDONTWRITEBYTECODE=1")
	drivers := filepath.Join(e.root, "test", "integration", "testdata", "roundtrip")
	ways := make([]map[string]rtWay, workers)
	for w := range ways {
		ways[w] = map[string]rtWay{
			"cli":        rtCLI{e},
			"go":         rtGo{e.c},
			"python":     startDriver(t, env, "/usr/bin/python3", filepath.Join(drivers, "sdk.py"), filepath.Join(e.root, "sdk", "python", "src")),
			"typescript": startDriver(t, env, "node", filepath.Join(drivers, "sdk.mjs"), filepath.Join(tsDir, "dist", "index.js")),
		}
	}
	return ways
}

// plan draws the round trips, by provider: two thirds gvisor, the ways in
// turn, sizes and variants at random.
func (r *rtRun) plan(n int, seed uint64) map[string][]*rtTrip {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	byProv := map[string][]*rtTrip{}
	for i := range n {
		prov := "gvisor"
		if i%3 == 2 {
			prov = "runc"
		}
		way := rtWays[i%len(rtWays)]
		w := r.ways[0][way]
		tr := &rtTrip{n: i, prov: prov, size: rtSize(rng), seed: rng.Uint64(), way: way,
			write: pick(rng, w.writeVariants()), read: pick(rng, w.readVariants()),
			path: fmt.Sprintf("/root/rt/%d.bin", i), src: filepath.Join(r.dir, fmt.Sprintf("%d.src", i))}
		byProv[prov] = append(byProv[prov], tr)
	}
	return byProv
}

// provider runs prov's round trips in one sandbox, in batches: each
// written and read back in one state, then read again after a stop (or a
// start), then removed.
func (r *rtRun) provider(prov string, trips []*rtTrip) {
	t, c := r.t, r.e.c
	sb := create(t, client.CreateRequest{Image: busybox, Provider: prov, Memory: jsonRaw("256MiB"), Disk: jsonRaw(rtDisk[prov]), Name: "roundtrips-" + prov})
	execOK(t, sb.ID, "mkdir", "-p", "/root/rt")
	state := "running"
	for len(trips) > 0 {
		batch := nextBatch(&trips)
		for _, tr := range batch {
			tr.state = state
		}
		parallel(batch, r.workers, func(w int, tr *rtTrip) {
			r.add(roundTrip(ctxLong(t), c, r.ways[w][tr.way], sb.ID, tr, r.dir), &r.moved, tr.size)
		})
		state = toggle(t, sb.ID, state)
		parallel(batch, r.workers, func(w int, tr *rtTrip) {
			way := rtWays[(indexOf(rtWays, tr.way)+1+int(tr.seed%3))%len(rtWays)]
			variant := pick(rand.New(rand.NewPCG(tr.seed, 1)), r.ways[w][way].readVariants())
			r.add(crossRead(ctxLong(t), c, r.ways[w][way], way, variant, sb.ID, state, tr, r.dir), &r.crossed, tr.size)
		})
		for _, tr := range batch {
			if _, err := c.RemoveFile(ctxT(t), sb.ID, tr.path, false); err != nil {
				t.Errorf("remove %s: %v", tr.path, err)
			}
			os.Remove(tr.src)
		}
	}
}

// add counts a round trip's bytes into *bytes, and its problem if any.
func (r *rtRun) add(p *rtProblem, bytes *int64, n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*bytes += n
	if p != nil {
		r.problems = append(r.problems, *p)
		r.t.Errorf("%s: %s: %v%s", p.trip, p.stage, p.err, p.mismatch)
	}
}

// roundTrip writes tr's file by its way, checks it inside when the sandbox
// runs, and reads it back.
func roundTrip(ctx context.Context, c *client.Client, w rtWay, sb string, tr *rtTrip, dir string) *rtProblem {
	sum, err := makeFile(tr.src, tr.seed, tr.size)
	if err != nil {
		return &rtProblem{trip: tr, stage: "make", err: err}
	}
	tr.sum = sum
	n, err := w.write(ctx, sb, tr.path, tr.src, tr.write, tr.seed)
	if err == nil && n != tr.size {
		err = fmt.Errorf("wrote %d bytes, not %d", n, tr.size)
	}
	if err != nil {
		return &rtProblem{trip: tr, stage: "write", err: err}
	}
	if tr.state == "running" {
		if p := checkInside(ctx, c, sb, tr, "inside"); p != nil {
			return p
		}
	}
	return readBack(ctx, w, tr.way, tr.read, sb, tr, dir, "read")
}

// crossRead reads tr's file again (the sandbox stopped or started since)
// by way, and inside when it runs now.
func crossRead(ctx context.Context, c *client.Client, w rtWay, way, variant, sb, state string, tr *rtTrip, dir string) *rtProblem {
	if state == "running" {
		if p := checkInside(ctx, c, sb, tr, "cross-inside"); p != nil {
			return p
		}
	}
	return readBack(ctx, w, way, variant, sb, tr, dir, "cross-read "+state+" "+way+"/"+variant)
}

func checkInside(ctx context.Context, c *client.Client, sb string, tr *rtTrip, stage string) *rtProblem {
	res, err := c.Exec(ctx, sb, client.ExecRequest{Argv: []string{"sha256sum", tr.path}})
	if err != nil || res.ExitCode != 0 {
		return &rtProblem{trip: tr, stage: stage, err: fmt.Errorf("sha256sum: %v %+v", err, res)}
	}
	got, _, _ := strings.Cut(string(res.Stdout), " ")
	if want := hex.EncodeToString(tr.sum[:]); got != want {
		return &rtProblem{trip: tr, stage: stage, err: errors.New("the bytes in the sandbox differ"), mismatch: fmt.Sprintf(" (its sha256sum is %s, want %s)", got, want)}
	}
	return nil
}

func readBack(ctx context.Context, w rtWay, way, variant, sb string, tr *rtTrip, dir, stage string) *rtProblem {
	dst := filepath.Join(dir, fmt.Sprintf("%d.%s.dst", tr.n, strings.ReplaceAll(stage, "/", "-")))
	defer os.Remove(dst)
	n, err := w.read(ctx, sb, tr.path, dst, variant, tr.seed)
	if err == nil && n != tr.size {
		err = fmt.Errorf("read %d bytes, not %d", n, tr.size)
	}
	if err != nil {
		return &rtProblem{trip: tr, stage: stage, err: err}
	}
	if m := compareFile(dst, tr.seed, tr.size, tr.sum); m != "" {
		return &rtProblem{trip: tr, stage: stage, err: errors.New("the bytes read back differ"), mismatch: m}
	}
	return nil
}

// nextBatch takes the round trips done between a stop and a start off
// trips: rtBatch of them, fewer when they would not all fit in a disk of
// rtBatchBytes.
func nextBatch(trips *[]*rtTrip) []*rtTrip {
	n, bytes := 0, int64(0)
	for n < len(*trips) && n < rtBatch && (n == 0 || bytes+(*trips)[n].size <= rtBatchBytes) {
		bytes += (*trips)[n].size
		n++
	}
	batch := (*trips)[:n]
	*trips = (*trips)[n:]
	return batch
}

// rtSize is a file size, 0 to rtMaxSize: a fifth at edges (of pages,
// pipes, the SDKs' and the helper's pieces, the reported 10.7 KB), most
// spread evenly over orders of magnitude, a fifth evenly over the range.
func rtSize(rng *rand.Rand) int64 {
	edges := []int64{0, 1, 511, 512, 4095, 4096, 4097, 10700, 10752, 10957, 11264, 65535, 65536, 65537,
		1<<20 - 1, 1 << 20, 1<<20 + 1, 3 << 20, 16<<20 - 4, 16 << 20, 16<<20 + 1, rtMaxSize}
	switch f := rng.Float64(); {
	case f < 0.2:
		return edges[rng.IntN(len(edges))]
	case f < 0.8:
		return int64(math.Exp(rng.Float64() * math.Log(rtMaxSize)))
	default:
		return rng.Int64N(rtMaxSize + 1)
	}
}

func pick(rng *rand.Rand, of []string) string { return of[rng.IntN(len(of))] }

func indexOf(of []string, s string) int {
	for i, v := range of {
		if v == s {
			return i
		}
	}
	return -1
}

// rtData is the bytes of a file made from seed.
func rtData(seed uint64) io.Reader {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	return rand.NewChaCha8(key)
}

// makeFile writes the size bytes made from seed at p.
func makeFile(p string, seed uint64, size int64) ([32]byte, error) {
	f, err := os.Create(p)
	if err != nil {
		return [32]byte{}, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(f, h), rtData(seed), size); err != nil {
		return [32]byte{}, err
	}
	return [32]byte(h.Sum(nil)), f.Close()
}

// compareFile says how the file at p differs from the size bytes made
// from seed (whose sha256 is sum), or "" when it does not.
func compareFile(p string, seed uint64, size int64, sum [32]byte) string {
	f, err := os.Open(p)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	h := sha256.New()
	got, _ := io.Copy(h, f)
	if got == size && [32]byte(h.Sum(nil)) == sum {
		return ""
	}
	f.Seek(0, io.SeekStart)
	want := bufio.NewReaderSize(io.LimitReader(rtData(seed), size), 1<<20)
	have := bufio.NewReaderSize(f, 1<<20)
	first, last, differ, zerosAfter := int64(-1), int64(-1), int64(0), true
	for off := int64(0); ; off++ {
		a, aerr := want.ReadByte()
		b, berr := have.ReadByte()
		if aerr != nil || berr != nil {
			break
		}
		if a != b {
			differ++
			last = off
			if first < 0 {
				first = off
			}
		}
		if first >= 0 && b != 0 {
			zerosAfter = false
		}
	}
	return fmt.Sprintf(" (%d bytes read, %d written; %d differ, first at %d, last at %d; zeros from the first on: %v)",
		got, size, differ, first, last, first >= 0 && zerosAfter)
}

// parallel runs fn on each trip, workers at a time; fn learns its worker.
func parallel(trips []*rtTrip, workers int, fn func(w int, tr *rtTrip)) {
	next := make(chan *rtTrip)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for tr := range next {
				fn(w, tr)
			}
		}()
	}
	for _, tr := range trips {
		next <- tr
	}
	close(next)
	wg.Wait()
}

// toggle stops a running sandbox or starts a stopped one; it returns the
// new state.
func toggle(t *testing.T, sb, state string) string {
	t.Helper()
	c := need(t).c
	if state == "running" {
		if _, err := c.Stop(ctxT(t), sb); err != nil {
			t.Fatalf("stop: %v", err)
		}
		return "stopped"
	}
	if _, err := c.Start(ctxT(t), sb); err != nil {
		t.Fatalf("start: %v", err)
	}
	return "running"
}

func ctxLong(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// busy keeps one CPU busy while the test runs: a shell's endless loop,
// stopped by its pid.
func busy(t *testing.T) {
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the busy loop: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
}

func rtSummary(byProv map[string][]*rtTrip, problems []rtProblem, moved, crossed int64, took time.Duration) string {
	type key struct{ prov, state, way string }
	count := map[key]int{}
	var keys []key
	total := 0
	for prov, trips := range byProv {
		for _, tr := range trips {
			k := key{prov, tr.state, tr.way}
			if count[k] == 0 {
				keys = append(keys, k)
			}
			count[k]++
			total++
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j])
	})
	var b strings.Builder
	mismatches, failures := 0, 0
	for _, p := range problems {
		if p.mismatch != "" {
			mismatches++
		} else {
			failures++
		}
	}
	fmt.Fprintf(&b, "%d round trips in %s: %s written and read back, %s read again after a stop or start; %d mismatches, %d other failures\n",
		total, took.Round(time.Second), sizeStr(moved), sizeStr(crossed), mismatches, failures)
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-7s %-8s %-11s %d\n", k.prov, k.state, k.way, count[k])
	}
	return b.String()
}

func sizeStr(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// rtCLI is the shard CLI: write (stdin a file, or a pipe fed in random
// pieces), cp in (the file, or a tar of it on stdin: the server unpacks
// it); cat (to a file, or a pipe read in random pieces) or cp out.
type rtCLI struct{ e *env }

func (rtCLI) writeVariants() []string {
	return []string{"write-file", "write-pipe", "cp-in", "cp-in-tar"}
}
func (rtCLI) readVariants() []string { return []string{"cat-file", "cat-pipe", "cp-out"} }

func (c rtCLI) cmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.e.bin, append([]string{"--socket", c.e.socket}, args...)...)
	cmd.Stderr = &bytes.Buffer{}
	return cmd
}

func cmdErr(cmd *exec.Cmd, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%v: %v: %s", cmd.Args[3:], err, cmd.Stderr.(*bytes.Buffer).Bytes())
}

func (c rtCLI) write(ctx context.Context, sb, path, src, variant string, seed uint64) (int64, error) {
	f, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, _ := f.Stat()
	var cmd *exec.Cmd
	switch variant {
	case "write-file":
		cmd = c.cmd(ctx, "write", sb, path)
		cmd.Stdin = f
	case "write-pipe":
		cmd = c.cmd(ctx, "write", sb, path)
		pr, pw, err := os.Pipe()
		if err != nil {
			return 0, err
		}
		defer pr.Close()
		cmd.Stdin = pr
		go func() {
			// Through a plain writer, so the pieces are the writes.
			io.CopyBuffer(struct{ io.Writer }{pw}, &pieces{r: f, rng: rand.New(rand.NewPCG(seed, 2)), most: 1 << 20}, make([]byte, 1<<20))
			pw.Close()
		}()
	case "cp-in":
		cmd = c.cmd(ctx, "cp", src, sb+":"+path)
	case "cp-in-tar":
		cmd = c.cmd(ctx, "cp", "-", sb+":"+filepath.Dir(path))
		pr, pw := io.Pipe()
		cmd.Stdin = pr
		go func() {
			tw := tar.NewWriter(pw)
			err := tw.WriteHeader(&tar.Header{Name: filepath.Base(path), Mode: 0o644, Size: fi.Size(), Typeflag: tar.TypeReg})
			if err == nil {
				_, err = io.Copy(tw, f)
			}
			if err == nil {
				err = tw.Close()
			}
			pw.CloseWithError(err)
		}()
	}
	return fi.Size(), cmdErr(cmd, cmd.Run())
}

func (c rtCLI) read(ctx context.Context, sb, path, dst, variant string, seed uint64) (int64, error) {
	if variant == "cp-out" {
		cmd := c.cmd(ctx, "cp", sb+":"+path, dst)
		if err := cmdErr(cmd, cmd.Run()); err != nil {
			return 0, err
		}
		fi, err := os.Stat(dst)
		if err != nil {
			return 0, err
		}
		return fi.Size(), nil
	}
	out, err := os.Create(dst)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	cmd := c.cmd(ctx, "cat", sb, path)
	if variant == "cat-file" {
		cmd.Stdout = out
		if err := cmdErr(cmd, cmd.Run()); err != nil {
			return 0, err
		}
		fi, err := out.Stat()
		if err != nil {
			return 0, err
		}
		return fi.Size(), nil
	}
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	n, cerr := io.CopyBuffer(struct{ io.Writer }{out}, &pieces{r: pipe, rng: rand.New(rand.NewPCG(seed, 3)), most: 256 << 10}, make([]byte, 256<<10))
	if err := cmdErr(cmd, cmd.Wait()); err != nil {
		return n, err
	}
	return n, cerr
}

// pieces reads r in reads of random sizes (up to most, mostly small).
type pieces struct {
	r    io.Reader
	rng  *rand.Rand
	most int
}

func (p *pieces) Read(b []byte) (int, error) {
	top := max(1, p.most/64)
	if p.rng.IntN(5) == 0 {
		top = p.most
	}
	return p.r.Read(b[:min(len(b), 1+p.rng.IntN(top))])
}

// rtGo is the Go client: a file (its length sent), random pieces
// (chunked) or a bytes.Reader; read with io.Copy or in random pieces.
type rtGo struct{ c *client.Client }

func (rtGo) writeVariants() []string { return []string{"file", "chunks", "bytes"} }
func (rtGo) readVariants() []string  { return []string{"copy", "chunks"} }

func (g rtGo) write(ctx context.Context, sb, path, src, variant string, seed uint64) (int64, error) {
	f, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var r io.Reader = f
	switch variant {
	case "chunks":
		r = &pieces{r: f, rng: rand.New(rand.NewPCG(seed, 4)), most: 1 << 20}
	case "bytes":
		b, err := io.ReadAll(f)
		if err != nil {
			return 0, err
		}
		r = bytes.NewReader(b)
	}
	res, err := g.c.WriteFile(ctx, sb, path, r, nil)
	if err != nil {
		return 0, err
	}
	return res.Bytes, nil
}

func (g rtGo) read(ctx context.Context, sb, path, dst, variant string, seed uint64) (int64, error) {
	rc, _, err := g.c.ReadFile(ctx, sb, path)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	out, err := os.Create(dst)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	var r io.Reader = rc
	if variant == "chunks" {
		r = &pieces{r: rc, rng: rand.New(rand.NewPCG(seed, 5)), most: 1 << 20}
	}
	// Through a plain writer: no ReadFrom, so the pieces are the reads.
	return io.CopyBuffer(struct{ io.Writer }{out}, r, make([]byte, 1<<20))
}

// rtDriver is an SDK's driver script (testdata/roundtrip), one job at a
// time over its stdio.
type rtDriver struct {
	mu     sync.Mutex
	cmd    *exec.Cmd
	in     io.Writer
	out    *bufio.Reader
	stderr *bytes.Buffer
	sdk    string
}

func startDriver(t *testing.T, env []string, interp, script, sdk string) *rtDriver {
	t.Helper()
	cmd := exec.Command(interp, script, sdk)
	cmd.Env = env
	d := &rtDriver{cmd: cmd, stderr: &bytes.Buffer{}, sdk: filepath.Base(script)}
	cmd.Stderr = d.stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", script, err)
	}
	d.in, d.out = in, bufio.NewReader(out)
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return d
}

func (*rtDriver) writeVariants() []string { return []string{"file", "chunks", "reuse", "bytes"} }
func (d *rtDriver) readVariants() []string {
	if d.sdk == "sdk.py" {
		return []string{"copy", "chunks", "into", "whole"}
	}
	return []string{"pipe", "iterate", "whole"}
}

func (d *rtDriver) write(ctx context.Context, sb, path, src, variant string, seed uint64) (int64, error) {
	return d.call(ctx, map[string]any{"op": "write", "sandbox": sb, "path": path, "src": src, "how": variant, "seed": seed % (1 << 31), "max_chunk": 1 << 20})
}

func (d *rtDriver) read(ctx context.Context, sb, path, dst, variant string, seed uint64) (int64, error) {
	return d.call(ctx, map[string]any{"op": "read", "sandbox": sb, "path": path, "dst": dst, "how": variant, "seed": seed % (1 << 31), "max_chunk": 1 << 20})
}

func (d *rtDriver) call(ctx context.Context, job map[string]any) (int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	line, _ := json.Marshal(job)
	if _, err := d.in.Write(append(line, '\n')); err != nil {
		return 0, fmt.Errorf("%s: %v: %s", d.sdk, err, d.stderr)
	}
	type answer struct {
		OK    bool   `json:"ok"`
		Bytes int64  `json:"bytes"`
		Error string `json:"error"`
	}
	got := make(chan answer, 1)
	fail := make(chan error, 1)
	go func() {
		l, err := d.out.ReadBytes('\n')
		if err != nil {
			fail <- fmt.Errorf("%s ended: %v: %s", d.sdk, err, d.stderr)
			return
		}
		var a answer
		if err := json.Unmarshal(l, &a); err != nil {
			fail <- fmt.Errorf("%s answered %q", d.sdk, l)
			return
		}
		got <- a
	}()
	select {
	case a := <-got:
		if !a.OK {
			return 0, fmt.Errorf("%s: %s", d.sdk, a.Error)
		}
		return a.Bytes, nil
	case err := <-fail:
		return 0, err
	case <-ctx.Done():
		// A driver stuck on a job is no use for the next: it goes.
		d.cmd.Process.Signal(syscall.SIGKILL)
		return 0, fmt.Errorf("%s: %v", d.sdk, ctx.Err())
	}
}
