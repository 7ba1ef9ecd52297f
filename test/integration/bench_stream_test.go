package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// streamBytes is what each variant of BenchmarkExecThroughput moves.
const streamBytes = 100 << 20

type counter struct{ n atomic.Int64 }

func (c *counter) Write(p []byte) (int, error) { c.n.Add(int64(len(p))); return len(p), nil }

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// BenchmarkExecThroughput: 100 MiB of a command's stdout (`head -c
// 104857600 /dev/zero`) and of its stdin (`wc -c`), through the CLI, the Go
// client (binary stream) and the NDJSON form, beside `runsc exec` / `runc
// exec` of the same command in the same sandbox, in the same run. Reports
// per variant the p50 seconds, MB/s, the throughput ratio to the raw
// runtime, and shard serve's CPU per 100 MiB (p50). Each variant runs b.N
// times; e.g.
//
//	SHARD_INTEGRATION=1 go test ./test/integration -run '^$' -bench ExecThroughput -benchtime 3x
func BenchmarkExecThroughput(b *testing.B) {
	e := need(b)
	ctx := context.Background()
	out := []string{"sh", "-c", "head -c " + strconv.Itoa(streamBytes) + " /dev/zero"}
	in := []string{"wc", "-c"}
	for _, prov := range providers {
		sb := create(b, client.CreateRequest{Image: busybox, Provider: prov, Memory: jsonRaw("512MiB")})
		// A command line (program first) each run starts afresh.
		raw := func(argv ...string) []string {
			if prov == "runc" {
				return append([]string{"runc", "--root", filepath.Join(e.runDir, "runc"), "exec", sb.ID}, argv...)
			}
			return append([]string{"runsc", "--root", filepath.Join(e.runDir, "runsc"), "--platform", "systrap",
				"--network", "sandbox", "--overlay2", "none", "exec", sb.ID}, argv...)
		}
		cli := func(argv ...string) []string {
			return append([]string{e.bin, "--socket", e.socket, "exec", sb.ID}, argv...)
		}
		// A variant moves streamBytes one way and says how many came.
		type variant struct {
			name  string
			shard bool
			run   func() (int64, error)
		}
		stdoutOf := func(cmd []string) func() (int64, error) {
			return func() (int64, error) {
				var n counter
				c := exec.Command(cmd[0], cmd[1:]...)
				c.Stdout = &n
				err := c.Run()
				return n.n.Load(), err
			}
		}
		stdinOf := func(cmd []string) func() (int64, error) {
			return func() (int64, error) {
				var o bytes.Buffer
				c := exec.Command(cmd[0], cmd[1:]...)
				c.Stdin, c.Stdout = io.LimitReader(zeros{}, streamBytes), &o
				err := c.Run()
				n, _ := strconv.ParseInt(strings.TrimSpace(o.String()), 10, 64)
				return n, err
			}
		}
		goOut := func(ndjson bool) func() (int64, error) {
			return func() (int64, error) {
				var n counter
				var err error
				if ndjson {
					err = ndjsonExec(ctx, e, sb.ID, out, &n)
				} else {
					_, err = e.c.ExecStream(ctx, sb.ID, client.ExecRequest{Argv: out}, &n, io.Discard)
				}
				return n.n.Load(), err
			}
		}
		goIn := func() (int64, error) {
			var o bytes.Buffer
			_, err := e.c.ExecPipe(ctx, sb.ID, client.ExecRequest{Argv: in}, io.LimitReader(zeros{}, streamBytes), &o, io.Discard)
			n, _ := strconv.ParseInt(strings.TrimSpace(o.String()), 10, 64)
			return n, err
		}
		rawName := "runsc-exec"
		if prov == "runc" {
			rawName = "runc-exec"
		}
		variants := []variant{
			{rawName + "-stdout", false, stdoutOf(raw(out...))},
			{"cli-stdout", true, stdoutOf(cli(out...))},
			{"go-stdout", true, goOut(false)},
			{"ndjson-stdout", true, goOut(true)},
			{rawName + "-stdin", false, stdinOf(raw(in...))},
			{"cli-stdin", true, stdinOf(cli(in...))},
			{"go-stdin", true, goIn},
		}
		secs := samples{}
		cpu := samples{}
		pid := e.server.Process.Pid
		for i := 0; i < b.N; i++ {
			for _, v := range variants {
				c0, t0 := procCPU(pid), time.Now()
				n, err := v.run()
				d := time.Since(t0)
				if err != nil || n != streamBytes {
					b.Fatalf("%s %s: %d bytes, %v", prov, v.name, n, err)
				}
				secs.add(v.name, d)
				if v.shard {
					cpu.add(v.name, procCPU(pid)-c0)
				}
			}
		}
		for _, v := range variants {
			p50 := pct(secs[v.name], 0.5) / 1000
			mbs := float64(streamBytes) / 1e6 / p50
			base := rawName + "-stdout"
			if strings.HasSuffix(v.name, "-stdin") {
				base = rawName + "-stdin"
			}
			ratio := pct(secs[base], 0.5) / 1000 / p50 // throughput ratio
			b.ReportMetric(p50, prov+"-"+v.name+"-p50-s")
			b.ReportMetric(ratio, prov+"-"+v.name+"-x-raw")
			line := fmt.Sprintf("%-6s %-22s n=%d p50 %6.2f s  %6.1f MB/s  %.2fx %s throughput", prov, v.name, len(secs[v.name]), p50, mbs, ratio, base)
			if v.shard {
				c := pct(cpu[v.name], 0.5) / 1000
				b.ReportMetric(c, prov+"-"+v.name+"-serve-cpu-s")
				line += fmt.Sprintf("  shard serve CPU %.2f s per 100 MiB", c)
			}
			fmt.Fprintln(os.Stderr, "BENCH", b.Name(), line)
		}
	}
}

// ndjsonExec runs argv through the NDJSON form (what a simple client gets
// without asking for the binary stream), decoding its base64 into w.
func ndjsonExec(ctx context.Context, e *env, id string, argv []string, w io.Writer) error {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", e.socket)
	}}}
	body, _ := json.Marshal(client.ExecRequest{Argv: argv})
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://shard/v0/sandboxes/"+id+"/exec", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		return fmt.Errorf("content type %q, want NDJSON when the binary stream is not asked for", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev client.ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return err
		}
		switch ev.Type {
		case "stdout":
			b, err := base64.StdEncoding.DecodeString(ev.Data)
			if err != nil {
				return err
			}
			w.Write(b)
		case "exit":
			return nil
		case "error":
			return fmt.Errorf("exec: %s", ev.Data)
		}
	}
	return fmt.Errorf("the stream ended early: %v", sc.Err())
}
