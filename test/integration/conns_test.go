package integration

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// connAttack, run in a sandbox: n TCP connections to host:port, held; then
// dns UDP queries to the sandbox's name server, each from a source port of
// its own (nothing awaited); then it prints its counts as JSON and holds
// the connections for hold seconds.
const connAttack = `
import json, socket, sys, time
host, port, n, dns, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
ok = refused = other = 0
socks = []
for i in range(n):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port)); ok += 1; socks.append(s)
    except ConnectionRefusedError:
        refused += 1; s.close()
    except OSError:
        other += 1; s.close()
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
q = bytes.fromhex("123401000001000000000000") + b"\x07allowed\x04test\x00\x00\x01\x00\x01"
for i in range(dns):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.sendto(q, (ns, 53))
    except OSError:
        pass
    u.close()
print(json.dumps({"ok": ok, "refused": refused, "other": other}), flush=True)
time.sleep(hold)
`

type attackResult struct{ OK, Refused, Other int }

// entriesFrom counts the host's conntrack entries whose original source is
// ip, and those of them to dst:port over proto (dst invalid: any).
func entriesFrom(t testing.TB, ip string, dst netip.Addr, proto uint8, port uint16) (all, to int) {
	t.Helper()
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	src := netip.MustParseAddr(ip)
	for _, f := range flows {
		s, _ := netip.AddrFromSlice(f.Forward.SrcIP)
		if s.Unmap() != src {
			continue
		}
		all++
		d, _ := netip.AddrFromSlice(f.Forward.DstIP)
		if d.Unmap() == dst && f.Forward.Protocol == proto && f.Forward.DstPort == port {
			to++
		}
	}
	return all, to
}

func hostConntrack(t testing.TB) int {
	b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// connEvents lists the sandbox.connections_refused events of a session.
func connEvents(t testing.TB, session string) []client.Event {
	t.Helper()
	page, err := need(t).c.Events(ctxT(t), session, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []client.Event
	for _, ev := range page.Events {
		if ev.Type == "sandbox.connections_refused" {
			out = append(out, ev)
		}
	}
	return out
}

// TestConnectionBound: with --max-connections 64, a sandbox (gvisor and
// runc) opening 300 connections to a target of the test's own gets 64,
// the rest refused at once; its UDP queries to the DNS proxy leave no
// entry in the host's table; the refusals are in its ledger session (one
// event, not one per refusal) and in /metrics; a second sandbox's exec
// works meanwhile.
func TestConnectionBound(t *testing.T) {
	e := need(t)
	setupTarget(t)
	const limit, n = 64, 300
	restartWith(t, "--dns-upstream", allowedIP+":53", "--max-connections", strconv.Itoa(limit))
	gw := netip.MustParsePrefix(e.subnet).Addr().Next()
	target := netip.MustParseAddr(allowedIP)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			attacker := create(t, client.CreateRequest{Image: python, Name: "conn-attacker-" + prov, Provider: prov})
			other := create(t, client.CreateRequest{Image: busybox, Name: "conn-other-" + prov, Provider: prov})
			before := scrapeMetrics(t, e.metrics, "")["shard_sandbox_connections_refused_total"]
			hostBefore := hostConntrack(t)

			done := make(chan *client.ExecResult, 1)
			go func() {
				res, err := e.c.Exec(context.Background(), attacker.ID, client.ExecRequest{Argv: []string{"python3", "-c", connAttack,
					allowedIP, "8000", strconv.Itoa(n), "2000", "8"}})
				if err != nil {
					t.Errorf("attack: %v", err)
				}
				done <- res
			}()
			// While it holds its connections: the host's entries of it
			// stay at the bound, and a neighbour's exec works.
			deadline := time.Now().Add(60 * time.Second)
			var all, toTarget int
			for time.Now().Before(deadline) {
				if all, toTarget = entriesFrom(t, attacker.IP, target, unix.IPPROTO_TCP, 8000); toTarget >= limit {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			time.Sleep(2 * time.Second) // the rest of its dials and its DNS flood
			all, toTarget = entriesFrom(t, attacker.IP, target, unix.IPPROTO_TCP, 8000)
			_, dnsUDP := entriesFrom(t, attacker.IP, gw, unix.IPPROTO_UDP, 53)
			hostDuring := hostConntrack(t)
			t.Logf("%s: attacker's entries %d (to the target %d, UDP to the DNS proxy %d); host table %d before, %d during",
				prov, all, toTarget, dnsUDP, hostBefore, hostDuring)
			if toTarget != limit || all > limit+8 {
				t.Errorf("the attacker holds %d entries to the target (%d in all), want %d", toTarget, all, limit)
			}
			if dnsUDP != 0 {
				t.Errorf("%d entries of UDP queries to the DNS proxy, want none", dnsUDP)
			}
			start := time.Now()
			if out := execOK(t, other.ID, "echo", "hi"); out != "hi\n" {
				t.Errorf("neighbour's exec: %q", out)
			}
			t.Logf("%s: neighbour's exec during the attack: %v", prov, time.Since(start))

			res := <-done
			if res == nil {
				t.FailNow()
			}
			var got attackResult
			if err := json.Unmarshal(res.Stdout, &got); err != nil {
				t.Fatalf("attack output %q %q: %v", res.Stdout, res.Stderr, err)
			}
			t.Logf("%s: attack %+v", prov, got)
			if got.OK != limit || got.Refused != n-limit || got.Other != 0 {
				t.Errorf("attack: %+v, want %d connected and %d refused at once", got, limit, n-limit)
			}
			// One event for the burst (then at most one a minute).
			var evs []client.Event
			for try := 0; try < 50 && len(evs) == 0; try++ {
				time.Sleep(100 * time.Millisecond)
				evs = connEvents(t, attacker.Session)
			}
			if len(evs) != 1 {
				t.Fatalf("%d connections_refused events, want 1", len(evs))
			}
			var data struct {
				Refused int64 `json:"refused"`
				Limit   int   `json:"limit"`
			}
			json.Unmarshal(evs[0].Data, &data)
			if data.Refused < 1 || data.Limit != limit {
				t.Errorf("event data %s", evs[0].Data)
			}
			if len(connEvents(t, other.Session)) != 0 {
				t.Error("the neighbour has a connections_refused event")
			}
			after := scrapeMetrics(t, e.metrics, "")["shard_sandbox_connections_refused_total"]
			if after-before < float64(n-limit) {
				t.Errorf("shard_sandbox_connections_refused_total grew by %v, want at least %d", after-before, n-limit)
			}
		})
	}
}
