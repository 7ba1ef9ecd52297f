package network

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// The DNS proxy is how domain names in egress policies are enforced: the
// firewall sees addresses only, so the addresses a sandbox may reach for
// "example.org" are the ones the proxy answered it for example.org. Each
// answer is put in the sandbox's sets (allowed: r-, denied: x-) before the
// sandbox gets it, so its first connection already finds the rule.
const (
	dnsUpstreamTimeout = 5 * time.Second  // for one query, all upstreams together
	dnsMaxInFlight     = 256              // queries being forwarded at once
	dnsMaxTCPConns     = 64               // open TCP connections from sandboxes
	dnsTCPIdle         = 10 * time.Second // a TCP connection with no query is closed
)

type dnsState struct {
	mu      sync.Mutex
	running bool
}

type dnsProxy struct {
	m         *Manager
	upstreams []string // host:port
	inflight  chan struct{}
	tcpConns  chan struct{}
}

// StartDNS starts the DNS proxy on the gateway (port 53, UDP and TCP), the
// name server of Manager.ResolvConf. It forwards each query from a sandbox
// to upstreams ("IP" or "IP:port"; empty: the host's /etc/resolv.conf name
// servers, loopback ones included since the proxy runs on the host) and
// hands the answer back unchanged, after opening or closing the answered
// addresses for that sandbox as its policy's domain names say. Queries
// from addresses that are not sandboxes are refused. It returns once
// listening, and stops when ctx ends.
func (m *Manager) StartDNS(ctx context.Context, upstreams []string) error {
	ups, err := dnsUpstreams(upstreams)
	if err != nil {
		return err
	}
	m.dns.mu.Lock()
	defer m.dns.mu.Unlock()
	if m.dns.running {
		return errors.New("the DNS proxy is running already")
	}
	addr := netip.AddrPortFrom(m.gateway, 53).String()
	var lc net.ListenConfig
	pc, err := lc.ListenPacket(ctx, "udp4", addr)
	if err != nil {
		return fmt.Errorf("DNS proxy: %w", err)
	}
	ln, err := lc.Listen(ctx, "tcp4", addr)
	if err != nil {
		pc.Close()
		return fmt.Errorf("DNS proxy: %w", err)
	}
	m.dns.running = true
	d := &dnsProxy{m: m, upstreams: ups, inflight: make(chan struct{}, dnsMaxInFlight), tcpConns: make(chan struct{}, dnsMaxTCPConns)}
	go func() {
		<-ctx.Done()
		pc.Close()
		ln.Close()
		m.dns.mu.Lock()
		m.dns.running = false
		m.dns.mu.Unlock()
	}()
	go d.serveUDP(pc.(*net.UDPConn))
	go d.serveTCP(ln)
	m.cfg.Log.Info("DNS proxy listening", "addr", addr, "upstreams", ups)
	return nil
}

func dnsUpstreams(in []string) ([]string, error) {
	if len(in) == 0 {
		b, err := os.ReadFile("/etc/resolv.conf")
		if err != nil {
			return nil, fmt.Errorf("DNS upstreams: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "nameserver" {
				in = append(in, f[1])
			}
		}
		if len(in) == 0 {
			return nil, errors.New("DNS upstreams: /etc/resolv.conf names no name server; give one")
		}
	}
	var out []string
	for _, s := range in {
		s = strings.TrimSpace(s)
		if ap, err := netip.ParseAddrPort(s); err == nil {
			out = append(out, ap.String())
			continue
		}
		a, err := netip.ParseAddr(strings.Trim(s, "[]"))
		if err != nil {
			return nil, fmt.Errorf("DNS upstream %q is not an IP or IP:port", s)
		}
		out = append(out, netip.AddrPortFrom(a.WithZone(""), 53).String())
	}
	return out, nil
}

func (d *dnsProxy) serveUDP(pc *net.UDPConn) {
	buf := make([]byte, 65535)
	for {
		n, from, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		q := append([]byte(nil), buf[:n]...)
		select {
		case d.inflight <- struct{}{}:
		default:
			continue // too busy: the client retries
		}
		go func() {
			defer func() { <-d.inflight }()
			if resp := d.handle(from.Addr().Unmap(), q, false); resp != nil {
				pc.WriteToUDPAddrPort(resp, from)
			}
		}()
	}
}

func (d *dnsProxy) serveTCP(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		select {
		case d.tcpConns <- struct{}{}:
		default:
			c.Close()
			continue
		}
		go func() {
			defer func() { <-d.tcpConns }()
			defer c.Close()
			from, _ := netip.ParseAddrPort(c.RemoteAddr().String())
			for {
				c.SetDeadline(time.Now().Add(dnsTCPIdle))
				q, err := readTCPMsg(c)
				if err != nil {
					return
				}
				d.inflight <- struct{}{}
				resp := d.handle(from.Addr().Unmap(), q, true)
				<-d.inflight
				if resp == nil {
					return
				}
				c.SetDeadline(time.Now().Add(dnsUpstreamTimeout))
				if err := writeTCPMsg(c, resp); err != nil {
					return
				}
			}
		}()
	}
}

func readTCPMsg(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

func writeTCPMsg(w io.Writer, m []byte) error {
	b := make([]byte, 2+len(m))
	binary.BigEndian.PutUint16(b, uint16(len(m)))
	copy(b[2:], m)
	_, err := w.Write(b)
	return err
}

// handle answers one query from src (nil: say nothing).
func (d *dnsProxy) handle(src netip.Addr, q []byte, tcp bool) []byte {
	if len(q) < 12 || q[2]&0x80 != 0 { // too short, or not a query
		return nil
	}
	if !d.m.fw.isSandboxAddr(src) {
		return dnsReply(q, dnsmessage.RCodeRefused)
	}
	resp, err := d.exchange(q, tcp)
	if err != nil {
		d.m.cfg.Log.Debug("DNS proxy: upstream", "err", err)
		return dnsReply(q, dnsmessage.RCodeServerFailure)
	}
	if answers, ttls := parseAnswer(resp); len(answers) > 0 {
		if err := d.m.fw.learn(src, answers, ttls); err != nil {
			// Fail closed: a denied domain's address must not be handed
			// out before it is blocked.
			d.m.cfg.Log.Warn("DNS proxy: learn addresses", "sandbox", src, "err", err)
			return dnsReply(q, dnsmessage.RCodeServerFailure)
		}
	}
	return resp
}

// exchange forwards q to the upstreams in turn, within dnsUpstreamTimeout
// in all, and returns the first answer to it.
func (d *dnsProxy) exchange(q []byte, tcp bool) ([]byte, error) {
	deadline := time.Now().Add(dnsUpstreamTimeout)
	var lastErr error
	for i, up := range d.upstreams {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		try := time.Now().Add(left / time.Duration(len(d.upstreams)-i))
		resp, err := exchangeOne(up, q, tcp, try)
		if err == nil {
			return resp, nil
		}
		lastErr = err
	}
	if lastErr == nil {
		lastErr = errors.New("timed out")
	}
	return nil, lastErr
}

func exchangeOne(up string, q []byte, tcp bool, deadline time.Time) ([]byte, error) {
	network := "udp"
	if tcp {
		network = "tcp"
	}
	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial(network, up)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(deadline)
	if tcp {
		if err := writeTCPMsg(c, q); err != nil {
			return nil, err
		}
		resp, err := readTCPMsg(c)
		if err != nil {
			return nil, err
		}
		if !answers(q, resp) {
			return nil, fmt.Errorf("%s answered something else", up)
		}
		return resp, nil
	}
	if _, err := c.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, 65535)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		if answers(q, buf[:n]) {
			return append([]byte(nil), buf[:n]...), nil
		}
	}
}

// answers reports whether resp is a response with q's ID.
func answers(q, resp []byte) bool {
	return len(resp) >= 12 && resp[0] == q[0] && resp[1] == q[1] && resp[2]&0x80 != 0
}

// dnsReply is an empty answer to q with rcode (nil if q does not parse).
func dnsReply(q []byte, rcode dnsmessage.RCode) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	qs, _ := p.AllQuestions()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode})
	b.StartQuestions()
	for _, qq := range qs {
		b.Question(qq)
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// parseAnswer reads the A records of a successful response that answer its
// question: owned by the question's name or by a name of the CNAME chain
// from it. Each address comes with the names it was reached by (question
// and chain, normalised) and the largest TTL it was given. Records about
// other names are ignored: a server does not get to vouch for names nobody
// asked about.
func parseAnswer(resp []byte) (map[netip.Addr][]string, map[netip.Addr]time.Duration) {
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil || !h.Response || h.RCode != dnsmessage.RCodeSuccess {
		return nil, nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) == 0 {
		return nil, nil
	}
	type aRec struct {
		owner string
		ip    netip.Addr
		ttl   time.Duration
	}
	var as []aRec
	cnames := map[string][]string{}
	for {
		rh, err := p.AnswerHeader()
		if err != nil {
			break // ErrSectionDone, or a broken message: use what was read
		}
		owner := normaliseName(rh.Name.String())
		inet := rh.Class == dnsmessage.ClassINET
		if rh.Type == dnsmessage.TypeA && inet {
			r, err := p.AResource()
			if err != nil {
				break
			}
			as = append(as, aRec{owner, netip.AddrFrom4(r.A), time.Duration(rh.TTL) * time.Second})
		} else if rh.Type == dnsmessage.TypeCNAME && inet {
			r, err := p.CNAMEResource()
			if err != nil {
				break
			}
			cnames[owner] = append(cnames[owner], normaliseName(r.CNAME.String()))
		} else if err := p.SkipAnswer(); err != nil {
			break
		}
	}
	if len(as) == 0 {
		return nil, nil
	}
	chain := map[string]bool{}
	var todo []string
	for _, q := range qs {
		if q.Class == dnsmessage.ClassINET {
			n := normaliseName(q.Name.String())
			if !chain[n] {
				chain[n] = true
				todo = append(todo, n)
			}
		}
	}
	for len(todo) > 0 {
		n := todo[0]
		todo = todo[1:]
		for _, t := range cnames[n] {
			if !chain[t] {
				chain[t] = true
				todo = append(todo, t)
			}
		}
	}
	names := make([]string, 0, len(chain))
	for n := range chain {
		names = append(names, n)
	}
	sort.Strings(names)
	addrs := map[netip.Addr][]string{}
	ttls := map[netip.Addr]time.Duration{}
	for _, a := range as {
		if !chain[a.owner] {
			continue
		}
		addrs[a.ip] = names
		if a.ttl > ttls[a.ip] {
			ttls[a.ip] = a.ttl
		}
	}
	if len(addrs) == 0 {
		return nil, nil
	}
	return addrs, ttls
}
