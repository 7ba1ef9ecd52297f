package integration

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// connFlood, run in a sandbox for dur seconds: as many flows as it can, in
// turn: a TCP connection to host:port kept open (up to 6000), a UDP query
// to its name server (the DNS proxy) from a new source port, and a TCP
// connection to denied (refused by its policy). It prints its counts.
const connFlood = `
import json, resource, socket, sys, time
host, port, denied, dur = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
q = bytes.fromhex("123401000001000000000000") + b"\x07allowed\x04test\x00\x00\x01\x00\x01"
st = {"held": 0, "refused": 0, "dns": 0, "denied": 0}
held = []
end = time.time() + dur
while time.time() < end:
    if len(held) < min(6000, hard - 100):
        s = socket.socket(); s.settimeout(1)
        try:
            s.connect((host, port)); held.append(s); st["held"] += 1
        except OSError:
            st["refused"] += 1; s.close()
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.sendto(q, (ns, 53)); st["dns"] += 1
    except OSError:
        pass
    u.close()
    s = socket.socket(); s.settimeout(1)
    try:
        s.connect((denied, port))
    except OSError:
        st["denied"] += 1
    s.close()
print(json.dumps(st))
`

// BenchmarkConnectionBound: a second sandbox's exec and create (busybox;
// gvisor and runc) before and while a runc sandbox floods the host with
// flows (connections to a target of the test's own, UDP queries to the
// DNS proxy from new source ports, connections its policy refuses), on a
// server with the default --max-connections. Ratios are during over
// before; the host's conntrack table is sampled meanwhile. With
// SHARD_BENCH_FLOOD=cpu the flooder only spins (the control: what a busy
// neighbour costs on this host, network aside).
//
//	flock /tmp/shard-heavy.lock env SHARD_INTEGRATION=1 go test -run '^$' -bench ConnectionBound -benchtime 1x ./test/integration
func BenchmarkConnectionBound(b *testing.B) {
	e := need(b)
	setupTarget(b)
	restartWith(b, "--dns-upstream", allowedIP+":53")
	ctx := context.Background()
	victims := map[string]*client.Sandbox{}
	for _, prov := range providers {
		victims[prov] = create(b, client.CreateRequest{Image: busybox, Name: "victim-" + prov, Provider: prov})
	}
	s := samples{}
	measure := func(phase string) {
		for _, prov := range providers {
			for range 40 {
				start := time.Now()
				res, err := e.c.Exec(ctx, victims[prov].ID, client.ExecRequest{Argv: []string{"true"}})
				if err != nil || res.ExitCode != 0 {
					b.Fatalf("%s exec in the victim (%s): %v %+v", phase, prov, err, res)
				}
				s.add("exec-"+prov+"-"+phase, time.Since(start))
			}
			for i := range 6 {
				start := time.Now()
				sb, err := e.c.Create(ctx, client.CreateRequest{Image: busybox, Name: fmt.Sprintf("victim-%s-%s-%d", prov, phase, i), Provider: prov})
				if err != nil {
					b.Fatalf("%s create (%s): %v", phase, prov, err)
				}
				s.add("create-"+prov+"-"+phase, time.Since(start))
				if err := e.c.Remove(ctx, sb.ID, true); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	measure("before")
	hostBefore := hostConntrack(b)

	attacker := create(b, client.CreateRequest{Image: python, Name: "flooder", Provider: "runc"})
	if _, err := e.c.SetPolicy(ctx, attacker.ID, client.Policy{Deny: []string{deniedIP + "/32"}}); err != nil {
		b.Fatal(err)
	}
	refusedBefore := scrapeMetrics(b, e.metrics, "")["shard_sandbox_connections_refused_total"]
	const dur = 90
	done := make(chan *client.ExecResult, 1)
	go func() {
		script := connFlood
		if os.Getenv("SHARD_BENCH_FLOOD") == "cpu" {
			// The control: the same busy process, no network; what the
			// victim loses to it is CPU, not the connection bounds.
			script = "import sys, time\nend = time.time() + float(sys.argv[4])\nwhile time.time() < end: pass\nprint('{}')"
		}
		res, err := e.c.Exec(ctx, attacker.ID, client.ExecRequest{Argv: []string{"python3", "-c", script, allowedIP, "8000", deniedIP, strconv.Itoa(dur)}})
		if err != nil {
			fmt.Fprintln(os.Stderr, "flood:", err)
		}
		done <- res
	}()
	var mu sync.Mutex
	hostMax, attackerMax := 0, 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
			h := hostConntrack(b)
			a, _ := entriesFrom(b, attacker.IP, netip.Addr{}, 0, 0)
			mu.Lock()
			hostMax, attackerMax = max(hostMax, h), max(attackerMax, a)
			mu.Unlock()
		}
	}()
	time.Sleep(10 * time.Second) // the flood reaches its bounds
	b.ResetTimer()
	measure("during")
	close(stop)
	wg.Wait()
	res := <-done
	refused := scrapeMetrics(b, e.metrics, "")["shard_sandbox_connections_refused_total"] - refusedBefore
	for _, prov := range providers {
		report(b, s, "exec-"+prov+"-before", "exec-"+prov+"-before", "exec-"+prov+"-during")
		report(b, s, "create-"+prov+"-before", "create-"+prov+"-before", "create-"+prov+"-during")
	}
	out := ""
	if res != nil {
		out = string(res.Stdout)
	}
	b.ReportMetric(float64(hostMax), "host-conntrack-max")
	b.ReportMetric(float64(attackerMax), "attacker-entries-max")
	fmt.Fprintf(os.Stderr, "BENCH %s host conntrack %d before, at most %d during; the flooder's entries at most %d; refused %v; flood %s\n",
		b.Name(), hostBefore, hostMax, attackerMax, refused, out)
}
